# Where the tree compiles below the build type's optimisation level, and
# why. Both only when the build type optimises.
#
# Test code at -O1. The tests' own units (the
# *_test executables and everything in tests/) were about a third of the
# build; -O1 compiles them about a fifth faster than -O2. The code under
# test is in the libraries, which keep the build type's level; a test
# body, harness or helper program gains nothing from -O2. Benchmarks
# (bench/, worker/'s programs) keep it too.
#
# CKPT_TEST_O1=OFF builds the tests at the build type's level.
option(CKPT_TEST_O1 "Compile the tests' own code at -O1" ON)
string(TOUPPER "${CMAKE_BUILD_TYPE}" _ckpt_type)
if(CMAKE_CXX_FLAGS_${_ckpt_type} MATCHES "-O[123s]")
  set(CKPT_OPTIMIZED_BUILD ON)
else()
  set(CKPT_OPTIMIZED_BUILD OFF)  # e.g. Debug: -O0 stays
endif()

# Command-line parsing at -Og: CLI11 (Debian's 2.1, header-only) makes each
# unit that includes it define and optimise its validators and parsers
# again, ~10 s of CPU per unit at -O2; -Og takes 20-40% off and parsing a
# command line once needs no more. `sources` are in the calling folder.
function(ckpt_cli_sources)
  if(CKPT_OPTIMIZED_BUILD)
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CXX>:-Og>")
  endif()
endfunction()

function(ckpt_optimize_tests_less)
  if(NOT CKPT_TEST_O1 OR NOT BUILD_TESTING)
    return()
  endif()
  if(NOT CKPT_OPTIMIZED_BUILD)
    return()
  endif()
  ckpt_collect_targets(${PROJECT_SOURCE_DIR} targets)  # cmake/Pch.cmake
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    get_target_property(dir ${t} SOURCE_DIR)
    if((type STREQUAL "EXECUTABLE" AND t MATCHES "_test$")
       OR (dir STREQUAL "${PROJECT_SOURCE_DIR}/tests"
           AND type MATCHES "^(EXECUTABLE|STATIC_LIBRARY)$"))
      # After the build type's flags on the command line: the last -O wins.
      target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O1>)
    endif()
  endforeach()
endfunction()
