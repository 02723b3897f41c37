/* test/test_nn_modules.c — the modules of include/nabla/nn.h: outputs and
 * gradients (wrt every parameter and the input) against PyTorch float64 on
 * fixed weights (test/golden/nn.txt, written by test/golden/gen_nn.py, which
 * holds each module's torch twin), the initializers' shapes, names and
 * moments (PyTorch's defaults), dropout with keys, and the errors. */
#include "golden_file.h"

TestSuite(nn_modules, .init = tc_setup, .fini = tc_teardown);

#define NM_TOL 1e-11

enum nm_kind { NM_LINEAR, NM_LAYER_NORM, NM_RMS_NORM, NM_MLP, NM_ATTENTION, NM_BLOCK, NM_GPT };

static const nb_block_config NM_BLOCK_CFG = {.dim = 8, .n_heads = 2, .hidden = 16, .bias = true};
static const nb_gpt_config NM_GPT_CFG = {
    .vocab = 11, .context = 6, .n_layers = 2, .block = {.dim = 8, .n_heads = 2, .bias = true}};

static nb_tensor *nm_apply(enum nm_kind k, const nb_tree *p, nb_tensor *x) {
  switch (k) {
  case NM_LINEAR: return nb_linear_apply(p, x);
  case NM_LAYER_NORM: return nb_layer_norm_apply(p, x, 1e-5);
  case NM_RMS_NORM: return nb_rms_norm_apply(p, x, 1e-6);
  case NM_MLP: return nb_mlp_apply(p, x, nb_gelu_tanh);
  case NM_ATTENTION: return nb_self_attention_apply(p, x, 2, true, NULL, 0);
  case NM_BLOCK: return nb_block_apply(p, &NM_BLOCK_CFG, x, NULL);
  case NM_GPT: return nb_gpt_apply(p, &NM_GPT_CFG, x, NULL);
  }
  return NULL;
}

/* in: params, data {"x", "cot"} -> {"loss": sum(y * cot)}, {"y": y} */
static nb_status nm_loss(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *y = nm_apply(*(enum nm_kind *)user, in[0], nb_tree_get(in[1], "x"));
  nb_tensor *loss = nb_sum(nb_mul(y, nb_tree_get(in[1], "cot")), NB_ALL, false);
  if (!loss) return nb_last_status();
  out[0] = nb_tree_create(), out[1] = nb_tree_create();
  nb_tree_set(out[0], "loss", loss);
  return nb_tree_set(out[1], "y", y);
}

/* The case's module: y and every gradient match torch's, eagerly and jitted. */
static void nm_check(const char *name, enum nm_kind kind) {
  gf_case *c = gf_load("nn.txt", name);
  nb_tree *p = nb_tree_create(), *data = nb_tree_create();
  for (int i = 0; i < c->n; i++)
    if (!c->rec[i].output && !strncmp(c->rec[i].name, "p.", 2))
      nb_tree_set(p, c->rec[i].name + 2, gf_tensor(c, c->rec[i].name, NB_DTYPE_COUNT));
  nb_tree_set(data, "x", gf_tensor(c, "x", NB_DTYPE_COUNT));
  nb_tree_set(data, "cot", gf_tensor(c, "cot", NB_DTYPE_COUNT));
  gf_expect(c, "y", nm_apply(kind, p, nb_tree_get(data, "x")), NM_TOL);
  nb_fn *f = nb_fn_create_trees(nm_loss, &kind, 2, 2), *vg = nb_value_and_grad(f, NB_AXES(0, 1));
  nb_fn *fns[2] = {vg, nb_jit(vg)};
  for (int j = 0; j < 2; j++) {
    nb_tree *in[2] = {p, data}, *out[4];
    cr_assert_eq(nb_call_trees(fns[j], in, out), NB_OK, "%s: %s", name, nb_last_error());
    gf_expect(c, "y", nb_tree_get(out[1], "y"), NM_TOL);
    cr_assert(nb_tree_same_structure(out[2], p, true), "%s: the gradient tree's structure", name);
    for (int i = 0; i < nb_tree_len(p); i++) {
      char rec[80];
      snprintf(rec, sizeof rec, "g.%s", nb_tree_name(p, i));
      gf_expect(c, rec, nb_tree_at(out[2], i), NM_TOL);
    }
    if (kind != NM_GPT) gf_expect(c, "dx", nb_tree_get(out[3], "x"), NM_TOL);
    for (int k = 0; k < 4; k++)
      nb_tree_release(out[k]);
  }
  nb_fn_release(fns[1]), nb_fn_release(vg), nb_fn_release(f);
  nb_tree_release(data), nb_tree_release(p);
  gf_free(c);
}

Test(nn_modules, linear_matches_torch) { nm_check("linear", NM_LINEAR); }
Test(nn_modules, layer_norm_matches_torch) { nm_check("layer_norm", NM_LAYER_NORM); }
Test(nn_modules, rms_norm_matches_torch) { nm_check("rms_norm", NM_RMS_NORM); }
Test(nn_modules, mlp_matches_torch) { nm_check("mlp", NM_MLP); }
Test(nn_modules, causal_self_attention_matches_torch) { nm_check("self_attention", NM_ATTENTION); }
Test(nn_modules, transformer_block_matches_torch) { nm_check("block", NM_BLOCK); }
Test(nn_modules, gpt_matches_torch) { nm_check("gpt", NM_GPT); }

/* ---- initializers ---------------------------------------------------------------------------- */
/* mean and variance of t's elements, and max |x| */
static void nm_moments(nb_tensor *t, double *mean, double *var, double *amax) {
  double *v = tc_read(t);
  int64_t n = nb_numel(t);
  double s = 0, s2 = 0, m = 0;
  for (int64_t i = 0; i < n; i++)
    s += v[i], m = fmax(m, fabs(v[i]));
  *mean = s / (double)n;
  for (int64_t i = 0; i < n; i++)
    s2 += (v[i] - *mean) * (v[i] - *mean);
  *var = s2 / (double)n, *amax = m;
  free(v);
}

Test(nn_modules, linear_init_is_torch_kaiming_uniform_for_weight_and_bias) {
  nb_tree *p = nb_linear_init(nb_key(3), 256, 384, true, NB_F32);
  cr_assert(p, "%s", nb_last_error());
  cr_assert_eq(nb_tree_len(p), 2);
  cr_assert_str_eq(nb_tree_name(p, 0), "w");
  cr_assert_str_eq(nb_tree_name(p, 1), "b");
  nb_shape ws = nb_shape_of(nb_tree_get(p, "w")), bs = nb_shape_of(nb_tree_get(p, "b"));
  cr_assert(ws.ndim == 2 && ws.dims[0] == 256 && ws.dims[1] == 384 && bs.ndim == 1 &&
            bs.dims[0] == 384);
  double bound = 1.0 / 16, mean, var, amax;
  /* U(-b, b): mean 0 (sd b / sqrt(3 n)), variance b^2 / 3 (relative sd sqrt(0.8 / n)) */
  nm_moments(nb_tree_get(p, "w"), &mean, &var, &amax);
  double n = 256.0 * 384;
  cr_assert(fabs(mean) < 5 * bound / sqrt(3 * n), "mean %g", mean);
  cr_assert(fabs(var / (bound * bound / 3) - 1) < 5 * sqrt(0.8 / n), "var %g", var);
  cr_assert(amax <= bound && amax > 0.99 * bound, "max %g", amax);
  nm_moments(nb_tree_get(p, "b"), &mean, &var, &amax);
  cr_assert(amax <= bound && amax > 0.9 * bound, "bias max %g", amax);
  cr_assert(fabs(var / (bound * bound / 3) - 1) < 5 * sqrt(0.8 / 384), "bias var %g", var);
  /* the same key gives the same weights; another key others */
  nb_tree *q = nb_linear_init(nb_key(3), 256, 384, true, NB_F32);
  nb_tree *r = nb_linear_init(nb_key(4), 256, 384, false, NB_F32);
  cr_assert_eq(
      nb_item(nb_max(nb_abs(nb_sub(nb_tree_get(p, "w"), nb_tree_get(q, "w"))), NB_ALL, false)), 0);
  cr_assert_gt(
      nb_item(nb_max(nb_abs(nb_sub(nb_tree_get(p, "w"), nb_tree_get(r, "w"))), NB_ALL, false)), 0);
  cr_assert_eq(nb_tree_len(r), 1, "no bias");
  nb_tree_release(p), nb_tree_release(q), nb_tree_release(r);
}

Test(nn_modules, embedding_init_is_standard_normal_and_norms_are_ones_and_zeros) {
  nb_tree *e = nb_embedding_init(nb_key(9), 500, 200, NB_F64);
  double mean, var, amax, n = 500.0 * 200;
  nm_moments(nb_tree_get(e, "w"), &mean, &var, &amax);
  cr_assert(fabs(mean) < 5 / sqrt(n) && fabs(var - 1) < 5 * sqrt(2 / n), "%g %g", mean, var);
  nb_tree *ln = nb_layer_norm_init(7, true, NB_F32), *rms = nb_rms_norm_init(7, NB_BF16);
  tc_assert_close_tol(nb_tree_get(ln, "w"), (double[]){1, 1, 1, 1, 1, 1, 1}, NB_SHAPE(7), 0);
  tc_assert_close_tol(nb_tree_get(ln, "b"), (double[]){0, 0, 0, 0, 0, 0, 0}, NB_SHAPE(7), 0);
  cr_assert_eq(nb_tree_len(rms), 1);
  cr_assert_eq(nb_dtype_of(nb_tree_get(rms, "w")), NB_BF16);
  nb_tree_release(e), nb_tree_release(ln), nb_tree_release(rms);
}

Test(nn_modules, gpt_init_names_and_shapes_follow_gpt2) {
  nb_gpt_config c = {
      .vocab = 65, .context = 32, .n_layers = 2, .block = {.dim = 48, .n_heads = 4, .bias = true}};
  nb_tree *p = nb_gpt_init(nb_key(1), &c, NB_F32);
  cr_assert(p, "%s", nb_last_error());
  /* 2 embeddings, 2 blocks of 16 (2 norms x 2, 8 attention, 4 MLP), ln_f x 2, lm_head */
  cr_assert_eq(nb_tree_len(p), 2 + 2 * 16 + 2 + 1);
  static const struct {
    const char *name;
    int ndim;
    int64_t d0, d1;
  } want[] = {{"wte.w", 2, 65, 48},        {"wpe.w", 2, 32, 48},       {"h.0.ln_1.w", 1, 48, 0},
              {"h.0.attn.w_q", 2, 48, 48}, {"h.0.attn.b_o", 1, 48, 0}, {"h.1.mlp.0.w", 2, 48, 192},
              {"h.1.mlp.1.w", 2, 192, 48}, {"ln_f.b", 1, 48, 0},       {"lm_head.w", 2, 48, 65}};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    nb_tensor *t = nb_tree_get(p, want[i].name);
    cr_assert(t, "no %s", want[i].name);
    nb_shape s = nb_shape_of(t);
    cr_assert(s.ndim == want[i].ndim && s.dims[0] == want[i].d0 &&
                  (s.ndim == 1 || s.dims[1] == want[i].d1),
              "%s", want[i].name);
  }
  nb_tree *blk = nb_tree_subtree(p, "h.1");
  nb_tensor *x = nb_random_normal(nb_key(2), NB_SHAPE(3, 5, 48), NB_F32);
  nb_tensor *y = nb_block_apply(blk, &c.block, x, NULL);
  cr_assert(y, "%s", nb_last_error());
  nb_tensor *idx = nb_from_data((int64_t[]){1, 2, 3, 64}, NB_SHAPE(2, 2), NB_I64);
  nb_tensor *logits = nb_gpt_apply(p, &c, idx, NULL);
  nb_shape ls = nb_shape_of(logits);
  cr_assert(ls.ndim == 3 && ls.dims[0] == 2 && ls.dims[1] == 2 && ls.dims[2] == 65);
  cr_assert(isfinite(nb_item(nb_sum(logits, NB_ALL, false))));
  nb_tree_release(blk), nb_tree_release(p);
}

/* ---- dropout with keys ----------------------------------------------------------------------- */
/* in: params, {"idx", "key"} -> {"logits"} */
static nb_status nm_drop_fn(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *y = nb_gpt_apply(in[0], user, nb_tree_get(in[1], "idx"), nb_tree_get(in[1], "key"));
  if (!y) return nb_last_status();
  out[0] = nb_tree_create();
  return nb_tree_set(out[0], "logits", y);
}

Test(nn_modules, gpt_dropout_draws_from_its_key_also_under_jit) {
  nb_gpt_config c = {.vocab = 13,
                     .context = 8,
                     .n_layers = 1,
                     .block = {.dim = 16, .n_heads = 2, .bias = true, .dropout = 0.3}};
  nb_tree *p = nb_gpt_init(nb_key(5), &c, NB_F32);
  nb_tensor *idx = nb_from_data((int32_t[]){1, 5, 7, 12, 0, 3, 3, 2}, NB_SHAPE(8), NB_I32);
  nb_gpt_config eval = c;
  eval.block.dropout = 0;
  double *plain = tc_read(nb_gpt_apply(p, &eval, idx, NULL));
  /* no key: no dropout, whatever the rate (the same graph; on a GPU the parameters,
   * pending in the first call, change which products take their bias in cuBLASLt's
   * epilogue, one rounding instead of two: the last bit may differ) */
  tc_assert_close_tol(nb_gpt_apply(p, &c, idx, NULL), plain, NB_SHAPE(8, 13),
                      tc_on_gpu() ? 1e-6 : 0);
  nb_fn *f = nb_fn_create_trees(nm_drop_fn, &c, 2, 1), *j = nb_jit(f);
  double *got[3];
  for (int k = 0; k < 3; k++) {
    nb_tree *batch = nb_tree_create(), *out;
    nb_tree_set(batch, "idx", idx);
    nb_tree_set(batch, "key", nb_key(k < 2 ? 100 : 101));
    cr_assert_eq(nb_call_trees(j, (nb_tree *[]){p, batch}, &out), NB_OK, "%s", nb_last_error());
    got[k] = tc_read(nb_tree_get(out, "logits"));
    nb_tree_release(out), nb_tree_release(batch);
  }
  double d01 = 0, d02 = 0, dp = 0;
  for (int i = 0; i < 8 * 13; i++)
    d01 += fabs(got[0][i] - got[1][i]), d02 += fabs(got[0][i] - got[2][i]),
        dp += fabs(got[0][i] - plain[i]);
  cr_assert_eq(d01, 0, "the same key drops the same elements");
  cr_assert_gt(d02, 0, "another key drops others under the same jitted program");
  cr_assert_gt(dp, 0, "dropout changes the logits");
  for (int k = 0; k < 3; k++)
    free(got[k]);
  free(plain);
  nb_fn_release(j), nb_fn_release(f);
  nb_tree_release(p);
}

/* ---- errors ---------------------------------------------------------------------------------- */
Test(nn_modules, errors_name_the_module_and_the_full_parameter_name) {
  nb_gpt_config c = {
      .vocab = 5, .context = 4, .n_layers = 2, .block = {.dim = 8, .n_heads = 2, .bias = true}};
  nb_tree *p = nb_gpt_init(nb_key(1), &c, NB_F32);
  nb_tensor *idx = nb_from_data((int64_t[]){1, 2, 3}, NB_SHAPE(3), NB_I64);
  nb_tree_remove(p, "h.1.attn.w_v");
  cr_assert_null(nb_gpt_apply(p, &c, idx, NULL));
  tc_assert_error(NB_ERR_ARG, "nb_gpt_apply: the parameter tree has no \"h.1.attn.w_v\"");
  nb_tree_set(p, "h.1.attn.w_v", nb_zeros(NB_SHAPE(7, 8), NB_F32));
  cr_assert_null(nb_gpt_apply(p, &c, idx, NULL));
  tc_assert_error(NB_ERR_SHAPE, "\"h.1.attn.w_v\" has shape [7,8], expected [8,*]");
  nb_tensor *long_idx = nb_zeros(NB_SHAPE(5), NB_I64);
  cr_assert_null(nb_gpt_apply(p, &c, long_idx, NULL));
  tc_assert_error(NB_ERR_SHAPE, "T <= context 4");
  nb_gpt_config bad = c;
  bad.block.n_heads = 3;
  cr_assert_null(nb_gpt_init(nb_key(1), &bad, NB_F32));
  tc_assert_error(NB_ERR_ARG, "nb_gpt_init: n_heads 3 does not divide dim 8");
  bad = c, bad.block.dropout = 1;
  cr_assert_null(nb_gpt_apply(p, &bad, idx, NULL));
  tc_assert_error(NB_ERR_ARG, "dropout 1 is outside [0, 1)");
  cr_assert_null(nb_linear_init(nb_key(1), 0, 3, true, NB_F32));
  tc_assert_error(NB_ERR_ARG, "nb_linear_init: in is 0");
  cr_assert_null(nb_linear_init(nb_key(1), 2, 3, true, NB_I32));
  tc_assert_error(NB_ERR_DTYPE, "nb_linear_init: dtype i32");
  nb_tree *lin = nb_linear_init(nb_key(1), 4, 3, true, NB_F32);
  cr_assert_null(nb_linear_apply(lin, nb_zeros(NB_SHAPE(2, 5), NB_F32)));
  tc_assert_error(NB_ERR_SHAPE, "nb_linear_apply: parameter \"w\" has shape [4,3], expected [5,*]");
  cr_assert_null(nb_mlp_apply(lin, nb_zeros(NB_SHAPE(2, 4), NB_F32), nb_relu));
  tc_assert_error(NB_ERR_ARG, "nb_mlp_apply: the parameter tree has no \"0.w\"");
  cr_assert_null(nb_self_attention_apply(NULL, nb_zeros(NB_SHAPE(2, 4), NB_F32), 2, true, NULL, 0));
  tc_assert_error(NB_ERR_NULL, "nb_self_attention_apply: the parameter tree is NULL");
  nb_tree_release(lin), nb_tree_release(p);
}
