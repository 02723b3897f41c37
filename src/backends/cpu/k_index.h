/* src/backends/cpu/k_index.h — CPU kernels of the indexing family
 * (src/ops/index.c). Indices are any integer dtype; a negative index counts from the
 * end; an index outside [-size, size) records NB_ERR_INDEX naming the op, the
 * index and the axis size, and the kernel returns that status. */
#ifndef NABLA_K_INDEX_H
#define NABLA_K_INDEX_H

#include "cpu.h"

nb_status nbi_cpu_take(const nb_tensor *n, nbi_view *out, const nbi_view *in);
nb_status nbi_cpu_take_along_axis(const nb_tensor *n, nbi_view *out, const nbi_view *in);
nb_status nbi_cpu_scatter_add(const nb_tensor *n, nbi_view *out, const nbi_view *in);
nb_status nbi_cpu_scatter_add_along_axis(const nb_tensor *n, nbi_view *out, const nbi_view *in);
nb_status nbi_cpu_one_hot(const nb_tensor *n, nbi_view *out, const nbi_view *in);

#endif
