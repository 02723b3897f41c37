/* test/grad_check.h — derivative checks shared by the autodiff tests.
 *
 * tc_check_grad(what, body, user, n_in, xs, flags) checks the derivatives of a
 * one-output function at the point xs (float64 tensors, realized):
 *  1. reverse mode: nb_vjp_fn(f)(xs, u) equals J^T u, J the central
 *     finite-difference Jacobian (step 1e-6), u a random cotangent;
 *  2. forward mode: nb_jvp_fn(f)(xs, v) equals J v for random tangents v;
 *  3. the dot-product identity <J v, u> = <v, J^T u> (to 1e-10);
 *  4. with TC_SECOND: for s(x) = <u, f(x)>, the Hessian-vector product H v by
 *     forward-over-reverse (jvp of grad s) and by reverse-over-reverse
 *     (grad of <v, grad s>) equals the finite difference of grad s along v.
 * Gradients must have their input's shape and dtype. Integer inputs (index
 * tensors) are best captured through `user`, so every input is differentiated.
 */
#ifndef NABLA_TEST_GRAD_CHECK_H
#define NABLA_TEST_GRAD_CHECK_H

#include "common.h"

enum {
  TC_SECOND = 1u << 0, /* also check second derivatives (smooth ops) */
};

#define TC_FD_STEP 1e-6
#define TC_FD_TOL 1e-6

/* An f64 tensor of shape s with values uniform in [lo, hi). */
static inline nb_tensor *tc_rand_f64(nb_shape s, double lo, double hi, uint64_t *seed) {
  int64_t n = tc_numel(s);
  double *x = calloc((size_t)(n ? n : 1), sizeof *x);
  tc_fill(x, n, lo, hi, seed);
  nb_tensor *t = tc_tensor(x, s, NB_F64);
  free(x);
  return t;
}

/* Asserts |got - want| <= tol * (1 + max |want|) elementwise. */
static inline void tc_assert_vec_close(const char *what, const char *part, const double *got,
                                       const double *want, int64_t n, double tol) {
  double scale = 1;
  for (int64_t i = 0; i < n; i++)
    if (fabs(want[i]) > scale) scale = fabs(want[i]);
  for (int64_t i = 0; i < n; i++)
    cr_assert(fabs(got[i] - want[i]) <= tol * scale, "%s: %s element %lld: got %.12g, want %.12g",
              what, part, (long long)i, got[i], want[i]);
}

static inline void tc_assert_like(const char *what, nb_tensor *g, nb_tensor *x) {
  cr_assert(g, "%s: NULL result: %s", what, nb_last_error());
  cr_assert(nbi_shape_eq(&g->shape, &x->shape) && g->dtype == x->dtype,
            "%s: result is %s %d-d, input %s %d-d", what, nb_dtype_name(g->dtype), g->shape.ndim,
            nb_dtype_name(x->dtype), x->shape.ndim);
}

/* Calls f on xs and returns out[0]'s values (n elements in *n_out). */
static inline double *tc_eval1(nb_fn *f, nb_tensor *const *xs, int64_t *n_out) {
  nb_tensor *out[1];
  cr_assert_eq(nb_call(f, xs, out), NB_OK, "call: %s", nb_last_error());
  if (n_out) *n_out = nb_numel(out[0]);
  return tc_read(out[0]);
}

/* xs with input k's element j moved by delta (fresh tensors). */
static inline void tc_perturbed(nb_tensor *const *xs, int n_in, double *const *host, int k,
                                int64_t j, double delta, nb_tensor **out) {
  for (int i = 0; i < n_in; i++) {
    if (i != k) {
      out[i] = xs[i];
      continue;
    }
    double old = host[k][j];
    host[k][j] = old + delta;
    out[i] = tc_tensor(host[k], nb_shape_of(xs[k]), NB_F64);
    host[k][j] = old;
  }
}

/* Reads ts[0..n-1] (each like[k]'s shape and dtype, asserted) one after
 * another into dst. */
static inline void tc_read_concat(const char *what, nb_tensor *const *ts, nb_tensor *const *like,
                                  int n, double *dst) {
  for (int k = 0; k < n; k++) {
    tc_assert_like(what, ts[k], like[k]);
    double *t = tc_read(ts[k]);
    memcpy(dst, t, (size_t)nb_numel(ts[k]) * sizeof *t);
    dst += nb_numel(ts[k]);
    free(t);
  }
}

/* The central finite-difference Jacobian (step TC_FD_STEP) of f's out[0]
 * (m elements) at the float64 inputs xs, whose values are host[k]: m x total
 * row-major (malloc'd), total the inputs' element count, columns input-major. */
static inline double *tc_fd_jacobian(nb_fn *f, nb_tensor *const *xs, int n_in, double *const *host,
                                     int64_t m, int64_t total) {
  cr_assert(n_in <= 8);
  double *J = calloc((size_t)(m * total + 1), sizeof *J);
  int64_t col = 0;
  for (int k = 0; k < n_in; k++)
    for (int64_t j = 0; j < nb_numel(xs[k]); j++, col++) {
      nb_scope_begin();
      nb_tensor *xp[8], *xm[8];
      tc_perturbed(xs, n_in, host, k, j, TC_FD_STEP, xp);
      tc_perturbed(xs, n_in, host, k, j, -TC_FD_STEP, xm);
      double *fp = tc_eval1(f, xp, NULL), *fm = tc_eval1(f, xm, NULL);
      for (int64_t i = 0; i < m; i++)
        J[i * total + col] = (fp[i] - fm[i]) / (2 * TC_FD_STEP);
      free(fp);
      free(fm);
      nb_scope_end();
    }
  return J;
}

typedef struct tc_inner_product {
  nb_fn *f;
  nb_tensor *u; /* s(x) = sum(f(x) * u) */
} tc_inner_product;

static inline nb_status tc_inner_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                      int n_out) {
  (void)n_in;
  (void)n_out;
  tc_inner_product *p = user;
  nb_tensor *y[1];
  nb_status st = nb_call(p->f, in, y);
  if (st) return st;
  out[0] = nb_sum(nb_mul(y[0], p->u), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static inline void tc_check_grad(const char *what, nb_fn_body body, void *user, int n_in,
                                 nb_tensor *const *xs, unsigned flags) {
  uint64_t seed = 99;
  nb_scope_begin();
  nb_fn *f = nb_fn_create(body, user, n_in, 1);
  cr_assert(f, "%s: %s", what, nb_last_error());
  int64_t m;
  double *y0 = tc_eval1(f, xs, &m);
  free(y0);
  nb_tensor *probe[1];
  cr_assert_eq(nb_call(f, xs, probe), NB_OK);
  nb_shape ys = nb_shape_of(probe[0]);

  double *host[8];
  int64_t nk[8], total = 0;
  cr_assert(n_in <= 8);
  for (int k = 0; k < n_in; k++) {
    host[k] = tc_read(xs[k]);
    nk[k] = nb_numel(xs[k]);
    total += nk[k];
  }
  double *J = tc_fd_jacobian(f, xs, n_in, host, m, total);
  int64_t col = 0;

  /* 1. reverse mode */
  nb_tensor *u = tc_rand_f64(ys, -1, 1, &seed);
  double *uh = tc_read(u);
  nb_fn *vjp = nb_vjp_fn(f);
  cr_assert(vjp, "%s: nb_vjp_fn: %s", what, nb_last_error());
  nb_tensor *vin[9], *vout[9];
  for (int k = 0; k < n_in; k++)
    vin[k] = xs[k];
  vin[n_in] = u;
  cr_assert_eq(nb_call(vjp, vin, vout), NB_OK, "%s: vjp: %s", what, nb_last_error());
  double *jtu_fd = calloc((size_t)total + 1, sizeof *jtu_fd), *jtu = calloc((size_t)total + 1, 8);
  for (int64_t c = 0; c < total; c++)
    for (int64_t i = 0; i < m; i++)
      jtu_fd[c] += J[i * total + c] * uh[i];
  tc_read_concat(what, vout + 1, xs, n_in, jtu);
  tc_assert_vec_close(what, "vjp vs finite differences", jtu, jtu_fd, total, TC_FD_TOL);

  /* 2. forward mode */
  nb_tensor *v[8];
  double *vh = calloc((size_t)total + 1, sizeof *vh);
  for (int k = 0; k < n_in; k++)
    v[k] = tc_rand_f64(nb_shape_of(xs[k]), -1, 1, &seed);
  tc_read_concat(what, v, xs, n_in, vh);
  nb_fn *jvp = nb_jvp_fn(f);
  cr_assert(jvp, "%s: nb_jvp_fn: %s", what, nb_last_error());
  nb_tensor *jin[16], *jout[2];
  for (int k = 0; k < n_in; k++)
    jin[k] = xs[k], jin[n_in + k] = v[k];
  cr_assert_eq(nb_call(jvp, jin, jout), NB_OK, "%s: jvp: %s", what, nb_last_error());
  cr_assert(nbi_shape_eq(&jout[1]->shape, &ys), "%s: tangent shape", what);
  double *jv = tc_read(jout[1]), *jv_fd = calloc((size_t)m + 1, sizeof *jv_fd);
  for (int64_t i = 0; i < m; i++)
    for (int64_t c = 0; c < total; c++)
      jv_fd[i] += J[i * total + c] * vh[c];
  tc_assert_vec_close(what, "jvp vs finite differences", jv, jv_fd, m, TC_FD_TOL);

  /* 3. dot-product identity */
  double lhs = 0, rhs = 0, mag = 1;
  for (int64_t i = 0; i < m; i++)
    lhs += jv[i] * uh[i], mag += fabs(jv[i] * uh[i]);
  for (int64_t c = 0; c < total; c++)
    rhs += vh[c] * jtu[c];
  cr_assert(fabs(lhs - rhs) <= 1e-10 * mag, "%s: <Jv,u> = %.15g but <v,J^T u> = %.15g", what, lhs,
            rhs);

  /* 4. second derivatives: H v of s(x) = <u, f(x)> */
  if (flags & TC_SECOND) {
    tc_inner_product ip = {f, u};
    nb_fn *s = nb_fn_create(tc_inner_body, &ip, n_in, 1);
    nb_fn *gs = nb_grad(s, NB_ALL);
    cr_assert(gs, "%s: nb_grad: %s", what, nb_last_error());
    double *hv_fd = calloc((size_t)total + 1, sizeof *hv_fd);
    nb_tensor *xp[8], *xm[8], *gp[8], *gm[8];
    for (int k = 0; k < n_in; k++) {
      double *vk = tc_read(v[k]), *xk = calloc((size_t)nk[k] + 1, sizeof *xk);
      for (int64_t j = 0; j < nk[k]; j++)
        xk[j] = host[k][j] + TC_FD_STEP * vk[j];
      xp[k] = tc_tensor(xk, nb_shape_of(xs[k]), NB_F64);
      for (int64_t j = 0; j < nk[k]; j++)
        xk[j] = host[k][j] - TC_FD_STEP * vk[j];
      xm[k] = tc_tensor(xk, nb_shape_of(xs[k]), NB_F64);
      free(vk);
      free(xk);
    }
    cr_assert_eq(nb_call(gs, xp, gp), NB_OK, "%s: grad: %s", what, nb_last_error());
    cr_assert_eq(nb_call(gs, xm, gm), NB_OK, "%s: grad: %s", what, nb_last_error());
    col = 0;
    for (int k = 0; k < n_in; k++) {
      double *a = tc_read(gp[k]), *b = tc_read(gm[k]);
      for (int64_t j = 0; j < nk[k]; j++)
        hv_fd[col + j] = (a[j] - b[j]) / (2 * TC_FD_STEP);
      free(a);
      free(b);
      col += nk[k];
    }
    /* forward over reverse */
    nb_fn *fwd = nb_jvp_fn(gs);
    nb_tensor *fo[16];
    cr_assert_eq(nb_call(fwd, jin, fo), NB_OK, "%s: jvp(grad): %s", what, nb_last_error());
    /* reverse over reverse: grad of <v, grad s(x)> */
    double *hv = calloc((size_t)total + 1, sizeof *hv);
    tc_read_concat(what, fo + n_in, xs, n_in, hv);
    tc_assert_vec_close(what, "jvp(grad) vs finite differences", hv, hv_fd, total, TC_FD_TOL);
    nb_fn *rr = nb_vjp_fn(gs);
    nb_tensor *rin[16], *ro[16];
    for (int k = 0; k < n_in; k++)
      rin[k] = xs[k], rin[n_in + k] = v[k];
    cr_assert_eq(nb_call(rr, rin, ro), NB_OK, "%s: vjp(grad): %s", what, nb_last_error());
    tc_read_concat(what, ro + n_in, xs, n_in, hv);
    tc_assert_vec_close(what, "vjp(grad) vs finite differences", hv, hv_fd, total, TC_FD_TOL);
    free(hv);
    free(hv_fd);
    nb_fn_release(rr);
    nb_fn_release(fwd);
    nb_fn_release(gs);
    nb_fn_release(s);
  }
  for (int k = 0; k < n_in; k++)
    free(host[k]);
  free(J);
  free(uh);
  free(jtu_fd);
  free(jtu);
  free(vh);
  free(jv);
  free(jv_fd);
  nb_fn_release(jvp);
  nb_fn_release(vjp);
  nb_fn_release(f);
  nb_scope_end();
}

#endif
