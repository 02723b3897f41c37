/* test/test_review_3.c — review of issue 6's second session (shard_map,
 * collectives, graph-mode propagation): defects found, each a test. */
#include <math.h>

#include "common.h"

#include "../src/sharding/sharding.h"

TestSuite(review_3, .init = tc_setup, .fini = tc_teardown);

/* ---- a jitted function with a collective, called in bodies on two meshes ---- */
static nb_status psum_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_all_reduce(in[0], "x", NB_REDUCE_SUM);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status call_jitted(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  return nb_call((nb_fn *)u, in, out);
}

Test(review_3, jit_in_bodies_on_two_meshes) {
  nb_fn *g = nb_fn_create(psum_body, NULL, 1, 1), *jg = nb_jit(g);
  nb_fn *body = nb_fn_create(call_jitted, jg, 1, 1);
  double v[8];
  for (int k = 0; k < 8; k++)
    v[k] = k + 1;
  for (int i = 0; i < 2; i++) {
    nb_mesh *m = nb_mesh_cpu(i == 0 ? "x=2" : "x=4");
    int n = i == 0 ? 2 : 4; /* n blocks of 2: the same local shape on both */
    nb_tensor *x = i == 0 ? tc_tensor(v, NB_SHAPE(4), NB_F64) : tc_tensor(v, NB_SHAPE(8), NB_F64),
              *y;
    nb_fn *f = nb_shard_map(body, m, (const char *[]){"x"}, (const char *[]){"_"});
    cr_assert(f, "%s", nb_last_error());
    cr_assert_eq(nb_call(f, &x, &y), NB_OK, "mesh %d: %s", i, nb_last_error());
    double ref[2] = {0, 0};
    for (int k = 0; k < 2 * n; k++)
      ref[k % 2] += v[k];
    tc_assert_close(y, ref, NB_SHAPE(2));
    nb_fn_release(f);
    nb_mesh_release(m);
  }
  nb_fn_release(body), nb_fn_release(jg), nb_fn_release(g);
}
