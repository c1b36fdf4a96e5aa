# ckpt_proto_library(NAME <target> PROTOS <file.proto>... [IMPORT_ROOT <dir>]
#                    [LINKS <proto library>...])
#
# The one protoc + grpc_cpp_plugin rule of the tree: generates
# <name>.pb.{h,cc} and <name>.grpc.pb.{h,cc} for each .proto (given relative
# to the calling folder) into that folder's build directory, and builds them
# into the static library <target>. The generated directory is the target's
# PUBLIC include directory (its interface: `#include "<name>.pb.h"`), and
# gRPC and protobuf are linked PUBLIC because the generated headers use them.
# With IMPORT_ROOT, each proto is a path relative to that directory (protoc's
# -I, for protos that import each other by such paths, as etcd's do) and its
# files are generated under the same relative path. LINKS: the proto
# libraries whose protos these import (linked PUBLIC).
# Generated code is compiled with warnings off (-w): it is not ours to fix.
#
# CKPT_PROTO_PREBUILT=<another build tree of this source> takes each such
# library, and its generated headers, from that tree instead of generating
# and compiling them again. scripts/test.sh gives it to the sanitizer
# build, which compiles the generated code without the sanitizers anyway
# (below), so the normal build's objects are the same code: compiling it
# twice was ~14% of that build. The tree must have been built first, from
# the same .proto files (checked here, at configure time).
find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
set(CKPT_PROTO_PREBUILT "" CACHE PATH
    "A build tree of this source whose protobuf libraries to use (empty: build them)")

function(ckpt_proto_library)
  cmake_parse_arguments(ARG "" "NAME;IMPORT_ROOT" "PROTOS;LINKS" ${ARGN})
  if(NOT ARG_NAME OR NOT ARG_PROTOS)
    message(FATAL_ERROR "ckpt_proto_library: NAME and PROTOS are required")
  endif()
  if(CKPT_PROTO_PREBUILT)
    ckpt_prebuilt_proto_library(${ARG_NAME} "${ARG_IMPORT_ROOT}" ${ARG_PROTOS})
    set_property(TARGET ${ARG_NAME} APPEND PROPERTY INTERFACE_LINK_LIBRARIES ${ARG_LINKS})
    return()
  endif()
  set(gen ${CMAKE_CURRENT_BINARY_DIR})
  set(srcs)
  set(all_protos)  # with IMPORT_ROOT the protos may import each other
  if(ARG_IMPORT_ROOT)
    foreach(proto ${ARG_PROTOS})
      list(APPEND all_protos ${ARG_IMPORT_ROOT}/${proto})
    endforeach()
  endif()
  foreach(proto ${ARG_PROTOS})
    get_filename_component(base ${proto} NAME_WE)
    if(ARG_IMPORT_ROOT)
      set(abs ${ARG_IMPORT_ROOT}/${proto})
      set(dir ${ARG_IMPORT_ROOT})
      get_filename_component(rel ${proto} DIRECTORY)
      set(base ${rel}/${base})
    else()
      get_filename_component(abs ${proto} ABSOLUTE)
      get_filename_component(dir ${abs} DIRECTORY)
    endif()
    set(out ${gen}/${base}.pb.cc ${gen}/${base}.grpc.pb.cc)
    add_custom_command(
      OUTPUT ${out} ${gen}/${base}.pb.h ${gen}/${base}.grpc.pb.h
      COMMAND protobuf::protoc
      ARGS --cpp_out=${gen} --grpc_out=${gen}
           --plugin=protoc-gen-grpc=${GRPC_CPP_PLUGIN}
           -I ${dir} ${abs}
      DEPENDS ${abs} ${all_protos}
      COMMENT "protoc ${proto}")
    list(APPEND srcs ${out})
  endforeach()
  add_library(${ARG_NAME} STATIC ${srcs})
  target_include_directories(${ARG_NAME} PUBLIC ${gen})
  target_link_libraries(${ARG_NAME} PUBLIC gRPC::grpc++ protobuf::libprotobuf ${ARG_LINKS})
  target_compile_options(${ARG_NAME} PRIVATE -w)
  # Generated sources define the same file-static names (cmake/Unity.cmake).
  set_target_properties(${ARG_NAME} PROPERTIES UNITY_BUILD OFF)
  # A sanitizer build compiles the generated code without the sanitizers:
  # instrumenting protoc's output was 17% of that build's CPU (306 of
  # 1,843 s; 3-4x a unit's normal cost), and finds nothing of ours. Our
  # uses of the messages (the inline accessors in the .pb.h) stay
  # instrumented in our units; the parsing underneath is libprotobuf's,
  # never instrumented. The precompiled header was built with the
  # sanitizers' macros, so these units go without it.
  if(CKPT_SANITIZE)
    target_compile_options(${ARG_NAME} PRIVATE -fno-sanitize=all)
    set_target_properties(${ARG_NAME} PROPERTIES DISABLE_PRECOMPILE_HEADERS ON)
  endif()
endfunction()

# The library <name> of CKPT_PROTO_PREBUILT's tree, as an imported target
# with the same interface. Refuses, naming the file, a library or header
# that is missing or older than its .proto.
function(ckpt_prebuilt_proto_library name import_root)
  file(RELATIVE_PATH rel ${CMAKE_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR})
  set(pre ${CKPT_PROTO_PREBUILT}/${rel})
  set(lib ${pre}/${CMAKE_STATIC_LIBRARY_PREFIX}${name}${CMAKE_STATIC_LIBRARY_SUFFIX})
  if(NOT EXISTS ${lib})
    message(FATAL_ERROR "CKPT_PROTO_PREBUILT: ${lib} does not exist (build ${name} in ${CKPT_PROTO_PREBUILT} first)")
  endif()
  foreach(proto ${ARGN})
    get_filename_component(base ${proto} NAME_WE)
    if(import_root)
      set(abs ${import_root}/${proto})
      get_filename_component(dir ${proto} DIRECTORY)
      set(base ${dir}/${base})
    else()
      get_filename_component(abs ${proto} ABSOLUTE)
    endif()
    set(header ${pre}/${base}.pb.h)
    # A proto generated at build time (etcd's, stripped) is judged by the
    # file it is made from: it is not there yet in this tree.
    if(EXISTS ${abs} AND (NOT EXISTS ${header} OR ${abs} IS_NEWER_THAN ${header}))
      message(FATAL_ERROR "CKPT_PROTO_PREBUILT: ${header} is missing or older than ${abs} (build ${CKPT_PROTO_PREBUILT} again)")
    endif()
  endforeach()
  add_library(${name} STATIC IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES
    IMPORTED_LOCATION ${lib}
    INTERFACE_INCLUDE_DIRECTORIES ${pre}
    INTERFACE_LINK_LIBRARIES "gRPC::grpc++;protobuf::libprotobuf")
endfunction()
