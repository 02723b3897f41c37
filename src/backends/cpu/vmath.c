/* src/backends/cpu/vmath.c — which instruction set the CPU kernels run with
 * (vmath.h): the best one the CPU supports, or NABLA_ISA's choice, picked once. */
#include "vmath.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char *const isa_names[NBI_ISA_COUNT] = {"portable", "avx2", "avx512"};

const char *nbi_isa_name(nbi_isa isa) {
  return isa >= 0 && isa < NBI_ISA_COUNT ? isa_names[isa] : "unknown";
}

nbi_isa nbi_isa_best(void) {
#if NBI_HAVE_ISA_VARIANTS
  __builtin_cpu_init();
  /* the variants use FMA too (every AVX2 CPU of Intel and AMD has it) */
  bool fma = __builtin_cpu_supports("fma");
  if (fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return NBI_ISA_AVX512;
  if (fma && __builtin_cpu_supports("avx2")) return NBI_ISA_AVX2;
#endif
  return NBI_ISA_PORTABLE;
}

/* -1 until first use; then the active nbi_isa. */
static atomic_int active = -1;

nbi_isa nbi_isa_select(nbi_isa want) {
  nbi_isa best = nbi_isa_best();
  nbi_isa isa = want < NBI_ISA_PORTABLE ? NBI_ISA_PORTABLE : want > best ? best : want;
  atomic_store_explicit(&active, (int)isa, memory_order_relaxed);
  return isa;
}

nbi_isa nbi_isa_active(void) {
  int isa = atomic_load_explicit(&active, memory_order_relaxed);
  if (isa >= 0) return (nbi_isa)isa;
  nbi_isa want = NBI_ISA_COUNT; /* the best */
  const char *env = getenv("NABLA_ISA");
  for (int k = 0; env && k < NBI_ISA_COUNT; k++)
    if (strcmp(env, isa_names[k]) == 0) want = (nbi_isa)k;
  return nbi_isa_select(want);
}
