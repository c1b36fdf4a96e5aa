# What a trainer builds against (component libckpt; in the one .deb, see
# packaging/package.cmake): libckpt.so.<version> with its SONAME link
# libckpt.so.1 and the link-time name libckpt.so, include/ckpt/, a
# pkg-config file ckpt.pc (the C API: `pkg-config --cflags --libs ckpt`)
# and a CMake package (find_package(ckpt) -> ckpt::client, with
# absl::status for the C++ API). Both files locate the prefix from where
# they are installed, so the same files serve `cmake --install --prefix`
# and the .deb's /usr (doc/linking.md).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS ckpt_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT libckpt
        NAMELINK_COMPONENT libckpt)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ckpt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT libckpt)

# ckpt.pc: the prefix relative to the file (pkg-config's ${pcfiledir}).
file(RELATIVE_PATH CKPT_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" CKPT_PC_TO_PREFIX "${CKPT_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/ckpt.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ckpt.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ckpt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT libckpt)

set(cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/ckpt)
configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/ckptConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ckptConfig.cmake INSTALL_DESTINATION ${cmake_dir}
  PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ckptConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ckptConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/ckptConfigVersion.cmake
        DESTINATION ${cmake_dir} COMPONENT libckpt)
