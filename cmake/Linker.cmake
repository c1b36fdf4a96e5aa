# The linker. LLVM's lld links this tree's 133
# executables (most of them test binaries with line tables) in 14 s of
# wall time where GNU ld takes 50 s (2 cores, `farm-bench --vs` of a relink
# of all of them, 2 pairs). Used when the compiler accepts -fuse-ld=lld
# (Debian's `lld`, which scripts/install-deps.sh installs); otherwise the
# compiler's default linker, with a note.
#
# CKPT_LLD=OFF keeps the compiler's default linker.
option(CKPT_LLD "Link with lld when the compiler can" ON)
if(CKPT_LLD)
  include(CheckLinkerFlag)
  check_linker_flag(CXX -fuse-ld=lld CKPT_HAVE_LLD)
  if(CKPT_HAVE_LLD)
    # C and C++ links only: nvcc's device links keep their own.
    add_link_options($<$<LINK_LANGUAGE:C,CXX>:-fuse-ld=lld>)
  else()
    message(STATUS "ckptd: lld not found (Debian: apt install lld); linking with the default linker")
  endif()
endif()
