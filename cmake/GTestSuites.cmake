# ckpt_gtest_discover_tests(target [PROPERTIES ...]): CTest tests for a
# GoogleTest binary, as gtest_discover_tests makes them: one per test, each
# in a process of its own.
#
# With CKPT_TEST_PER_SUITE=ON there is one CTest test per gtest suite
# instead: a process runs the suite's tests one after the other, as
# running the binary by hand does. The sanitizer suite of scripts/test.sh
# uses it: an instrumented test binary spends ~0.4 s of CPU starting (its
# globals registered, protobuf's descriptors built) before its first test,
# and ~540 of its ~680 tests were that start and one test. The properties
# given apply to each suite, with a TIMEOUT multiplied by the number of
# its tests. A suite is never marked skipped: ctest's skip pattern, which
# gtest_discover_tests sets, would hide a failure beside a skipped test.
option(CKPT_TEST_PER_SUITE "One CTest test per GoogleTest suite rather than per test" OFF)

function(ckpt_gtest_discover_tests target)
  # A sanitizer build instruments the code under test (the libraries,
  # ckptd and the tools the tests start), not the tests' own units:
  # instrumenting a test unit took ~45% more of its compile time (15.6
  # against 8.7 CPU-s for util_test's largest, with the precompiled
  # header), about a third of that build's CPU, to check GoogleTest's
  # macros and the tests' scaffolding. The process still carries both
  # runtimes, so every access of the libraries' code is checked. Their
  # precompiled header is one built without the sanitizers as well
  # (cmake/Pch.cmake: CKPT_PCH_UNINSTRUMENTED).
  if(CKPT_SANITIZE)
    target_compile_options(${target} PRIVATE -fno-sanitize=all)
    # Tells these units that their process runs the sanitizers' runtime.
    target_compile_definitions(${target} PRIVATE CKPT_SANITIZER_RUNTIME=1)
    set_target_properties(${target} PROPERTIES CKPT_PCH_UNINSTRUMENTED ON)
  endif()
  if(NOT CKPT_TEST_PER_SUITE)
    gtest_discover_tests(${target} ${ARGN})
    return()
  endif()
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "PROPERTIES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "ckpt_gtest_discover_tests(${target}): only PROPERTIES is supported, not ${arg_UNPARSED_ARGUMENTS}")
  endif()
  set(dir ${CMAKE_CURRENT_BINARY_DIR})
  # The properties, as a CMake list the discovery script reads back.
  file(WRITE ${dir}/${target}_suite_props.cmake "set(props [==[${arg_PROPERTIES}]==])\n")
  set(ctest_file ${dir}/${target}_suites.cmake)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D exe=$<TARGET_FILE:${target}> -D out=${ctest_file}
            -D props_file=${dir}/${target}_suite_props.cmake -D workdir=${dir}
            -P ${PROJECT_SOURCE_DIR}/cmake/GTestSuitesAdd.cmake
    BYPRODUCTS ${ctest_file}
    VERBATIM)
  # As gtest_discover_tests: a binary not built yet is a test that fails
  # naming it, not an error of ctest's.
  file(WRITE ${dir}/${target}_include.cmake
       "if(EXISTS [==[${ctest_file}]==])\n"
       "  include([==[${ctest_file}]==])\n"
       "else()\n"
       "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${dir}/${target}_include.cmake)
endfunction()
