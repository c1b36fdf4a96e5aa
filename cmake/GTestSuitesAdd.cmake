# Run at build time by ckpt_gtest_discover_tests (cmake/GTestSuites.cmake):
# lists the tests of `exe` and writes `out`, a CTest file with one test per
# suite. Inputs: exe, out, props_file (sets `props`), workdir.
include(${props_file})
execute_process(COMMAND ${exe} --gtest_list_tests
                WORKING_DIRECTORY ${workdir}
                OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${exe} --gtest_list_tests failed (${rc}):\n${listing}")
endif()
# Suites are the unindented lines ("Suite." or "Prefix/Suite.  # TypeParam"),
# their tests the indented ones below them.
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(suite "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.")
    set(suite ${CMAKE_MATCH_1})
    list(APPEND suites ${suite})
    set(count_${suite} 0)
  elseif(line MATCHES "^  [^ ]" AND suite AND NOT line MATCHES "^  DISABLED_")
    math(EXPR count_${suite} "${count_${suite}} + 1")
  endif()
endforeach()
# COST: the number of tests, so that ctest, which has no timings of its
# own on a first run, starts the longest suites first rather than last.
set(script "")
foreach(suite IN LISTS suites)
  if(count_${suite} EQUAL 0)
    continue()  # every test of it disabled
  endif()
  set(args "")
  set(timeout_next OFF)
  foreach(p IN LISTS props)
    if(timeout_next)
      math(EXPR p "${p} * ${count_${suite}}")
      set(timeout_next OFF)
    elseif(p STREQUAL "TIMEOUT")
      set(timeout_next ON)
    endif()
    string(APPEND args " [==[${p}]==]")
  endforeach()
  string(APPEND script
         "add_test([==[${suite}]==] [==[${exe}]==] [==[--gtest_filter=${suite}.*]==])\n"
         "set_tests_properties([==[${suite}]==] PROPERTIES WORKING_DIRECTORY [==[${workdir}]==]"
         " COST ${count_${suite}}${args})\n")
endforeach()
file(WRITE ${out} "${script}")
