# Unity builds: each target's sources are compiled
# in batches, one translation unit per batch. Most of a unit's time here is
# spent on the gRPC, protobuf and abseil templates and inline functions that
# every unit instantiates and optimises again; a batch does that once.
# Generated protobuf sources stay out (their file-static tables collide;
# cmake/ProtoLibrary.cmake), as do sources with their own compile options
# (CMake leaves those out by itself).
#
# CKPT_UNITY=OFF compiles each file alone (e.g. to check that each file
# includes what it uses, or for the fastest rebuild of one edited file).
option(CKPT_UNITY "Compile each target's sources in batches (unity build)" ON)
set(CKPT_UNITY_BATCH 8 CACHE STRING "Sources per unity batch")
if(CKPT_UNITY)
  set(CMAKE_UNITY_BUILD ON)
  set(CMAKE_UNITY_BUILD_BATCH_SIZE ${CKPT_UNITY_BATCH})
endif()
