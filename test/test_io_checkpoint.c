/* test/test_io_checkpoint.c — nb_save_checkpoint / nb_load_checkpoint
 * (include/nabla/io.h): a run of AdamW steps (clipping, warmup-cosine
 * schedule, noise drawn from a key split every step) stopped after 3 steps,
 * saved, everything released (parameters, state, key, the optimizer itself)
 * and restored from the file, then continued, gives the losses and the final
 * parameters of a run that never stopped, bit for bit. */
#include "common.h"

#include <unistd.h>

TestSuite(io_ckpt, .init = tc_setup, .fini = tc_teardown);

enum { N = 16, DIN = 4, DOUT = 3, STEPS = 6, STOP = 3 };

/* loss = mean((x @ w + b - y)^2) */
static nb_status loss_body(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *pred =
      nb_add(nb_matmul(nb_tree_get(in[1], "x"), nb_tree_get(in[0], "w")), nb_tree_get(in[0], "b"));
  nb_tensor *loss = nb_mean(nb_square(nb_sub(pred, nb_tree_get(in[1], "y"))), NB_ALL, false);
  out[0] = nb_tree_create();
  return nb_tree_set(out[0], "loss", loss);
}

static double formula(int i, int k) { return (double)((i * 7 + k * 3) % 11 - 5) / 4.0; }

static nb_tensor *formula_tensor(nb_shape s, int k) {
  double v[64];
  for (int i = 0; i < tc_numel(s); i++)
    v[i] = formula(i, k);
  return tc_tensor(v, s, NB_F32);
}

static nb_tree *init_params(void) {
  nb_tree *p = nb_tree_create();
  cr_assert_eq(nb_tree_set(p, "w", formula_tensor(NB_SHAPE(DIN, DOUT), 1)), NB_OK);
  cr_assert_eq(nb_tree_set(p, "b", formula_tensor(NB_SHAPE(DOUT), 2)), NB_OK);
  return p;
}

static nb_optim *make_optim(void) {
  nb_optim *parts[2] = {nb_clip_by_global_norm(0.5), nb_adamw(0.05, 0.9, 0.99, 1e-8, 0.1)};
  nb_optim *o = nb_optim_chain(parts, 2);
  nb_optim_release(parts[0]), nb_optim_release(parts[1]);
  nb_schedule *lr = nb_schedule_warmup_cosine(0, 0.05, 2, 10, 0.005);
  cr_assert_eq(nb_optim_set_schedule(o, lr), NB_OK);
  nb_schedule_release(lr);
  return o;
}

/* One step: a new key from *key (retained, replaced), noise from the other
 * half, value and gradient, the optimizer's step. Returns the loss. */
static double train_step(nb_optim *opt, nb_fn *vg, nb_tree *params, nb_tree *state,
                         nb_tensor **key) {
  nb_scope_begin();
  nb_tensor *k[2];
  cr_assert_eq(nb_key_split(*key, 2, k), NB_OK, "%s", nb_last_error());
  nb_tree *batch = nb_tree_create();
  nb_tensor *noise = nb_mul_scalar(nb_random_normal(k[1], NB_SHAPE(N, DIN), NB_F32), 0.1);
  cr_assert_eq(nb_tree_set(batch, "x", nb_add(formula_tensor(NB_SHAPE(N, DIN), 3), noise)), NB_OK);
  cr_assert_eq(nb_tree_set(batch, "y", formula_tensor(NB_SHAPE(N, DOUT), 4)), NB_OK);
  nb_tree *in[2] = {params, batch}, *out[2];
  cr_assert_eq(nb_call_trees(vg, in, out), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_optim_step(opt, params, out[1], state), NB_OK, "%s", nb_last_error());
  double loss = nb_item(nb_tree_get(out[0], "loss"));
  nb_release(*key);
  *key = nb_retain(k[0]);
  nb_tree_release(out[0]), nb_tree_release(out[1]), nb_tree_release(batch);
  nb_scope_end();
  return loss;
}

static void params_bytes(nb_tree *p, float *dst) {
  cr_assert_eq(nb_to_host(nb_tree_get(p, "w"), dst, DIN * DOUT * 4), NB_OK);
  cr_assert_eq(nb_to_host(nb_tree_get(p, "b"), dst + DIN * DOUT, DOUT * 4), NB_OK);
}

Test(io_ckpt, checkpoint_resume_is_bit_exact) {
  nb_fn *f = nb_fn_create_trees(loss_body, NULL, 2, 1), *vg = nb_value_and_grad(f, NB_AXES(0));
  cr_assert(vg, "%s", nb_last_error());
  /* the uninterrupted run */
  double want[STEPS];
  float want_p[DIN * DOUT + DOUT];
  {
    nb_optim *opt = make_optim();
    nb_tree *p = init_params(), *st = nb_optim_init(opt, p);
    nb_tensor *key = nb_retain(nb_key(7));
    for (int s = 0; s < STEPS; s++)
      want[s] = train_step(opt, vg, p, st, &key);
    params_bytes(p, want_p);
    nb_release(key), nb_tree_release(st), nb_tree_release(p), nb_optim_release(opt);
  }
  cr_assert(want[STEPS - 1] < want[0], "the loss decreases: %g -> %g", want[0], want[STEPS - 1]);
  /* stopped after STOP steps, saved, everything dropped */
  char path[64];
  snprintf(path, sizeof path, "/tmp/nabla_ckpt_%ld.safetensors", (long)getpid());
  {
    nb_optim *opt = make_optim();
    nb_tree *p = init_params(), *st = nb_optim_init(opt, p);
    nb_tensor *key = nb_retain(nb_key(7));
    for (int s = 0; s < STOP; s++) {
      double l = train_step(opt, vg, p, st, &key);
      cr_assert(l == want[s], "step %d: %.17g vs %.17g", s, l, want[s]);
    }
    cr_assert_eq(nb_save_checkpoint(path, p, st, STOP, key), NB_OK, "%s", nb_last_error());
    nb_release(key), nb_tree_release(st), nb_tree_release(p), nb_optim_release(opt);
  }
  /* restored into a fresh optimizer, continued */
  nb_optim *opt = make_optim();
  nb_tree *p, *st;
  int64_t step;
  nb_tensor *key;
  cr_assert_eq(nb_load_checkpoint(path, &p, &st, &step, &key), NB_OK, "%s", nb_last_error());
  cr_assert_eq(step, STOP);
  cr_assert(key);
  key = nb_retain(key);
  nb_tree *fresh = init_params(), *fresh_st = nb_optim_init(opt, fresh);
  cr_assert(nb_tree_same_structure(p, fresh, true));
  cr_assert(nb_tree_same_structure(st, fresh_st, true), "the state's names, shapes, dtypes");
  nb_tree_release(fresh), nb_tree_release(fresh_st);
  for (int s = STOP; s < STEPS; s++) {
    double l = train_step(opt, vg, p, st, &key);
    cr_assert(l == want[s], "step %d after restoring: %.17g vs %.17g", s, l, want[s]);
  }
  float got_p[DIN * DOUT + DOUT];
  params_bytes(p, got_p);
  cr_assert(!memcmp(got_p, want_p, sizeof got_p), "final parameters differ");
  nb_release(key), nb_tree_release(st), nb_tree_release(p), nb_optim_release(opt);
  nb_fn_release(vg), nb_fn_release(f);
  unlink(path);
}

Test(io_ckpt, checkpoint_errors) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/nabla_ckpt_e_%ld.safetensors", (long)getpid());
  nb_tree *p = init_params();
  cr_assert_eq(nb_save_checkpoint(path, p, NULL, 0, nb_zeros(NB_SHAPE(3), NB_I64)), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "a key is i64 [2]");
  cr_assert_eq(nb_save_checkpoint(NULL, p, NULL, 0, NULL), NB_ERR_NULL);
  nb_clear_error();
  /* no optimizer state and no key: empty tree, NULL key; a huge step survives */
  cr_assert_eq(nb_save_checkpoint(path, p, NULL, INT64_MAX - 1, NULL), NB_OK, "%s",
               nb_last_error());
  nb_tree *q, *o;
  int64_t step;
  nb_tensor *key = (nb_tensor *)1;
  cr_assert_eq(nb_load_checkpoint(path, &q, &o, &step, &key), NB_OK, "%s", nb_last_error());
  cr_assert(!key && step == INT64_MAX - 1 && nb_tree_len(o) == 0 && nb_tree_len(q) == 2);
  nb_tree_release(q), nb_tree_release(o);
  /* a plain safetensors file is not a checkpoint */
  cr_assert_eq(nb_save_safetensors(path, p, NULL, 0), NB_OK);
  cr_assert_eq(nb_load_checkpoint(path, &q, NULL, NULL, NULL), NB_ERR_IO);
  cr_assert_null(q);
  tc_assert_error(NB_ERR_IO, "not a nabla checkpoint");
  nb_tree_release(p);
  unlink(path);
}
