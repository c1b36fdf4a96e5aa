# Precompiled headers for every C++ target of the tree. Most translation
# units here include gRPC, protobuf, abseil and GoogleTest headers through
# the generated *.pb.h files; parsing them was about a third of each unit's
# compile time. One PCH target is built once and reused by every target.
# GCC refuses a PCH built with -fPIC in a -fPIE unit, so executables'
# own units are compiled -fPIC as the libraries' are (they still link as
# PIE): a second, PIE, header cost each build ~20 CPU-s and, with the
# sanitizers, ~35.
#
# CKPT_PCH=OFF builds without them (e.g. to check that each file includes
# what it uses).
option(CKPT_PCH "Precompiled headers for the heavy third-party headers" ON)
# A PCH is only used by units compiled with the same macros: -pthread
# (which defines _REENTRANT) everywhere, not only where Threads is linked.
if(CKPT_PCH)
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-pthread>)
  add_link_options(-pthread)
  # GCC 12's -Warray-bounds and -Wstringop-overflow report libstdc++'s own
  # std::string operator+ and vector<string>::push_back as out of bounds
  # depending on inlining decisions (GCC PRs 105329, 105651, 107138), and
  # the PCH changes those decisions: five such reports in 277 units, none
  # real. They stay on in a -DCKPT_PCH=OFF build and with other compilers.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-array-bounds>
                        $<$<COMPILE_LANGUAGE:CXX>:-Wno-stringop-overflow>)
  endif()
endif()

# Every buildsystem target defined under `dir`, recursively.
function(ckpt_collect_targets dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    ckpt_collect_targets(${sub} sub_targets)
    list(APPEND targets ${sub_targets})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(ckpt_enable_pch)
  if(NOT CKPT_PCH)
    return()
  endif()
  set(headers <algorithm> <atomic> <chrono> <condition_variable> <deque>
      <filesystem> <fstream> <functional> <map> <memory> <mutex> <optional>
      <set> <sstream> <string> <string_view> <thread> <vector>
      <absl/status/status.h> <absl/status/statusor.h> <absl/strings/str_cat.h>
      <google/protobuf/message.h> <grpcpp/grpcpp.h>)
  if(BUILD_TESTING)
    list(APPEND headers <gtest/gtest.h>)
  endif()
  set(unit ${CMAKE_BINARY_DIR}/ckpt_pch_unit.cc)
  file(WRITE ${unit} "// The unit the precompiled headers are built with.\nint main() { return 0; }\n")
  add_library(ckpt_pch_lib STATIC ${unit})
  target_link_libraries(ckpt_pch_lib PRIVATE gRPC::grpc++ protobuf::libprotobuf absl::status)
  target_precompile_headers(ckpt_pch_lib PRIVATE ${headers})
  # A sanitizer build compiles the tests' own units without the
  # sanitizers (cmake/GTestSuites.cmake); a header precompiled with them
  # defines __SANITIZE_ADDRESS__ and is refused there, so those units get
  # one of their own. Without it they parsed every header again: ~40 of
  # that build's ~120 units, and its largest.
  if(CKPT_SANITIZE)
    add_library(ckpt_pch_uninstrumented STATIC ${unit})
    target_link_libraries(ckpt_pch_uninstrumented PRIVATE gRPC::grpc++ protobuf::libprotobuf absl::status)
    target_compile_options(ckpt_pch_uninstrumented PRIVATE -fno-sanitize=all)
    target_compile_definitions(ckpt_pch_uninstrumented PRIVATE CKPT_SANITIZER_RUNTIME=1)
    target_precompile_headers(ckpt_pch_uninstrumented PRIVATE ${headers})
  endif()
  ckpt_collect_targets(${PROJECT_SOURCE_DIR} targets)
  foreach(t IN LISTS targets)
    if(t MATCHES "^ckpt_pch_")
      continue()
    endif()
    set(pch ckpt_pch_lib)
    get_target_property(uninstrumented ${t} CKPT_PCH_UNINSTRUMENTED)
    if(uninstrumented AND CKPT_SANITIZE)
      set(pch ckpt_pch_uninstrumented)
    endif()
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$")
      continue()
    endif()
    # nvcc units cannot use GCC's PCH: leave targets with CUDA sources out.
    get_target_property(sources ${t} SOURCES)
    if(sources MATCHES "\\.cu(;|$)")
      continue()
    endif()
    # Targets that opt out (their own optimisation level: worker/, bench/).
    get_target_property(off ${t} DISABLE_PRECOMPILE_HEADERS)
    if(off)
      continue()
    endif()
    if(type STREQUAL "EXECUTABLE")
      # After CMake's -fPIE on the command line, so it wins.
      target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fPIC>)
    endif()
    set_property(TARGET ${t} PROPERTY PRECOMPILE_HEADERS_REUSE_FROM ${pch})
  endforeach()
endfunction()
