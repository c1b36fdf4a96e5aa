#define CKPT_ISA_NS avx2
#include "util/checksum_impl.inc"
