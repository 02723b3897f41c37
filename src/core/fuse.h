/* src/core/fuse.h — the planner's fusion pass (fuse.c), for the planner
 * (graph.c) and nb_graph_dot (dot.c): grouping steps, describing each group
 * backend-neutrally once per plan, running a group through its device's
 * backend. nbi.h, "fusion", says what groups are; backend.h, "fused groups",
 * what a description holds. */
#ifndef NABLA_FUSE_H
#define NABLA_FUSE_H

#include "../backends/backend.h"

/* A fused group as a plan keeps it: its description and, for each operand k,
 * where a run finds its tensor: input operand_in[k] of member
 * operand_member[k] (the inputs as the plan runs them, aliased inputs swapped
 * to their sources), and, for a per-row operand, whether its reader's shape is
 * the keepdims form of the per-row shape (F's row dims then ones) rather than
 * the row dims alone, which fixes how its dims lie over F's row axes. Depends
 * on the graph's structure only. */
typedef struct nbi_fused {
  nbi_group g;
  uint8_t operand_member[NBI_FUSE_MAX];
  uint8_t operand_in[NBI_FUSE_MAX];
  bool operand_keep[NBI_FUSE_MAX];
} nbi_fused;

/* nodes[0..n-1]: a realization's steps in topological order, each node's mark
 * = its index (inputs with mark < 0 are leaves); held[i]: step i's value must
 * be kept after the realization. Writes group[i] (the first step of i's group;
 * groups are runs of consecutive steps that run as one kernel at their last
 * step) and store[i] (i's value needs a buffer). A group grows only while its
 * device's backend takes it (group_ok on its description). */
void nbi_fuse_plan(nb_tensor *const *nodes, int n, const bool *held, int *group, bool *store);
/* The last step of the group step i belongs to (the step that runs it). */
int nbi_fuse_group_end(const int *group, int n, int i);
/* The descriptions of the groups of nodes[0..n-1] (as nbi_fuse_plan left
 * group and store), in order, one per group of two or more steps: malloc'd,
 * *n_fused of them; NULL when out of memory. A group that has no description
 * or that its device refuses is first split into single steps (group[c] = c,
 * store[c] = true). */
nbi_fused *nbi_fuse_describe_groups(nb_tensor *const *nodes, int n, int *group, bool *store,
                                    int *n_fused);
/* Runs the group nodes[0..d->g.n_members - 1] that d describes: allocates
 * buffers for its stored members (a member that already has one, an input's
 * buffer taken in place, keeps it), builds its operand views and calls the
 * device's run_group; on failure no member keeps a buffer. */
nb_status nbi_fuse_run(const nbi_fused *d, nb_tensor *const *nodes);
/* The views nbi_fuse_run will give d's backend for nodes (d's steps), for a
 * backend's prepare: tensors without storage yet as contiguous views at
 * NBI_PREDICTED_DATA (backend.h). */
void nbi_fuse_predict_views(const nbi_fused *d, nb_tensor *const *nodes, nbi_view *out,
                            nbi_view *in);
/* The same for a step that runs alone: its output and its inputs in[0..n_in). */
void nbi_fuse_predict_node(const nb_tensor *t, nbi_view *out, nbi_view *in);
/* Whether step t is an elementwise op computing in its own dtype, f32 or f64:
 * its kernel (alone or in an elementwise group) reads each operand element
 * only to write the element at the same index (plan.c, "In place"). */
bool nbi_fuse_elementwise_step(const nb_tensor *t);

#endif
