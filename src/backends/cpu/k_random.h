/* src/backends/cpu/k_random.h — keyed random numbers (the RANDOM op). */
#ifndef NABLA_CPU_K_RANDOM_H
#define NABLA_CPU_K_RANDOM_H

#include "cpu.h"

nb_status nbi_cpu_random(const nb_tensor *n, nbi_view *out, const nbi_view *in);

#endif
