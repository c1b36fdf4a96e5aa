#define CKPT_ISA_NS avx512
#include "util/checksum_impl.inc"
