# Installation and the Debian package (doc/operations.md, "Install from the
# .deb"). `cmake --install build` installs under CMAKE_INSTALL_PREFIX;
# `cpack -G DEB` in the build directory (scripts/package-deb.sh does both
# steps) builds ckptd_<version>_amd64.deb from the same rules, with
# /usr/bin binaries, the systemd units, /etc configuration (conffiles),
# each binary's --help text, and maintainer scripts that create the ckptd
# account and directories. The version is project(VERSION).

set(CKPT_PACKAGED_BINARIES ckptd ckpt-coordinator ckpt-relay ckptctl ckptrun ckpt-worker)
set(CKPT_HELP_TEXTS)
foreach(bin IN LISTS CKPT_PACKAGED_BINARIES)
  if(NOT TARGET ${bin})
    continue()
  endif()
  install(TARGETS ${bin} RUNTIME DESTINATION bin)
  # The --help text each binary prints, as documentation next to the units.
  set(help ${CMAKE_BINARY_DIR}/packaging/help/${bin}.txt)
  add_custom_command(OUTPUT ${help}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/packaging/help
    COMMAND $<TARGET_FILE:${bin}> --help > ${help}
    DEPENDS ${bin} VERBATIM)
  list(APPEND CKPT_HELP_TEXTS ${help})
endforeach()
add_custom_target(ckpt_help_texts ALL DEPENDS ${CKPT_HELP_TEXTS})
install(FILES ${CKPT_HELP_TEXTS} DESTINATION share/doc/ckptd/help OPTIONAL)

# /lib/systemd/system: where bookworm's packages put units (and where
# deb-systemd-helper looks), whatever CMAKE_INSTALL_PREFIX is.
set(unit_dir /lib/systemd/system)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/ckptd.service
              ${PROJECT_SOURCE_DIR}/packaging/ckpt-coordinator.service
              ${PROJECT_SOURCE_DIR}/packaging/ckpt-relay.service
        DESTINATION ${unit_dir})
# Absolute: /etc is /etc whatever the prefix (conffiles of the package);
# `cmake --install` honours DESTDIR for them.
install(FILES ${PROJECT_SOURCE_DIR}/packaging/ckptd.toml
              ${PROJECT_SOURCE_DIR}/packaging/ckpt-coordinator.toml
        DESTINATION /etc)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/debian/default-ckptd DESTINATION /etc/default RENAME ckptd)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/debian/default-ckpt-relay DESTINATION /etc/default RENAME ckpt-relay)
install(FILES ${PROJECT_SOURCE_DIR}/doc/operations.md ${PROJECT_SOURCE_DIR}/doc/kubernetes.md
        DESTINATION share/doc/ckptd OPTIONAL)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/packaging/k8s DESTINATION share/doc/ckptd/examples OPTIONAL)

# The Python package (python/CMakeLists.txt installs it, component
# "python"): ckpt/ in lib/python3/dist-packages, loading libckpt.so.1.
# python3 is a dependency; torch stays a suggestion (ckpt imports without it).
#
# The development files (client/install.cmake, component libckpt:
# libckpt.so.1 and its libckpt.so link, include/ckpt/, ckpt.pc, the CMake
# package) are in this same .deb, not a libckpt-dev of their own: a trainer
# links libckpt to talk to the ckptd of its node, so every machine that
# builds or runs one has this package already; the development files add
# ~40 KB to it; and one package keeps one version of the library, the
# daemon and the protocol between them, which a split could let drift
# (a libckpt1 from one build beside a ckptd from another). The .deb
# Provides libckpt1 and libckpt-dev for build dependencies that name them.

set(CPACK_PACKAGE_NAME ckptd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "ckptd developers")
set(CPACK_PACKAGE_CONTACT "ckptd developers <ckptd@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "node-local checkpoint daemon for large-model training")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "node-local checkpoint daemon for large-model training\n ckptd stages training checkpoints in shared memory and persists them to disk;\n ckpt-coordinator coordinates multi-node jobs, ckpt-relay carries a rack's\n heartbeats to it. Includes ckptctl, ckptrun,\n ckpt-worker, the systemd units, the Python package and libckpt with its\n development files (headers, pkg-config ckpt, CMake find_package(ckpt)).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # ckptd_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# adduser: the postinst creates the ckptd account (not in a minbase system).
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser, python3")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, pkg-config, cmake, libabsl-dev")
set(CPACK_DEBIAN_PACKAGE_PROVIDES "libckpt1, libckpt-dev")
# shlibs for packages linked against libckpt.so.1 (the ldconfig trigger:
# packaging/debian/triggers).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_STRIP_FILES ON)
set(deb_scripts ${CMAKE_BINARY_DIR}/packaging/debian)
foreach(script postinst prerm postrm conffiles triggers)
  file(COPY ${PROJECT_SOURCE_DIR}/packaging/debian/${script} DESTINATION ${deb_scripts}
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                        WORLD_READ WORLD_EXECUTE)
endforeach()
file(CHMOD ${deb_scripts}/conffiles ${deb_scripts}/triggers PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${deb_scripts}/postinst ${deb_scripts}/prerm ${deb_scripts}/postrm ${deb_scripts}/conffiles
    ${deb_scripts}/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_GENERATOR DEB)
include(CPack)

# Tests of the packaging (packaging/tests/; exit 77 = skipped, the reason
# printed): the units as systemd reads them, the Kubernetes manifests
# against the real binaries' flags, and the .deb in a clean Debian 12 (in
# a chroot and a private mount namespace, no port: it runs beside other
# tests, and first, being the longest of the slow ones).
set(tests_dir ${PROJECT_SOURCE_DIR}/packaging/tests)
# The development files as a trainer's build meets them (pkg-config for C,
# find_package for C++), from a `cmake --install` into a scratch prefix.
if(BUILD_TESTING AND CKPT_SYSTEM_TESTS AND TARGET ckpt_shared)
  add_test(NAME packaging_dev_files_build_c_and_cxx_trainers
           COMMAND ${tests_dir}/dev_install_test.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(packaging_dev_files_build_c_and_cxx_trainers PROPERTIES LABELS system TIMEOUT 300)
endif()
if(BUILD_TESTING AND TARGET ckptd AND TARGET ckpt-coordinator AND TARGET ckpt-relay)
  add_test(NAME packaging_units_pass_verify_and_security_ceiling
           COMMAND ${tests_dir}/check_units.sh $<TARGET_FILE:ckptd> $<TARGET_FILE:ckpt-coordinator>
                   $<TARGET_FILE:ckpt-relay>)
  add_test(NAME packaging_k8s_manifests_match_binaries
           COMMAND /usr/bin/python3 ${tests_dir}/check_k8s.py --manifests ${PROJECT_SOURCE_DIR}/packaging/k8s
                   --ckptd $<TARGET_FILE:ckptd> --coordinator $<TARGET_FILE:ckpt-coordinator>
                   --version ${PROJECT_VERSION})
  set_tests_properties(packaging_units_pass_verify_and_security_ceiling packaging_k8s_manifests_match_binaries
                       PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
  if(CKPT_SLOW_TESTS AND TARGET ckptctl AND TARGET ckptrun AND TARGET ckpt-worker)
    add_test(NAME packaging_deb_installs_in_clean_bookworm
             COMMAND ${tests_dir}/deb_install_test.sh ${CMAKE_BINARY_DIR} ${PROJECT_VERSION})
    set_tests_properties(packaging_deb_installs_in_clean_bookworm PROPERTIES
                         LABELS slow SKIP_RETURN_CODE 77 TIMEOUT 1800 COST 10000)
  endif()
endif()
