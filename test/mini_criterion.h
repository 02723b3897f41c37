/* test/mini_criterion.h — the few Criterion macros a standalone test binary
 * needs (TestSuite, Test, cr_assert*, cr_expect*), for builds Criterion cannot
 * run under: ThreadSanitizer (its fixed-address arena collides with TSan's
 * memory layout). test/common.h includes it instead of <criterion/criterion.h>
 * when TC_STANDALONE is defined; `make test TSAN=1` builds test_threads.c so.
 * Tests run in registration order in one process; a failed assert ends the
 * process with status 1, a failed expect is counted. TC_OWN_MAIN: the test
 * defines main and calls tcm_main(). */
#ifndef NABLA_MINI_CRITERION_H
#define NABLA_MINI_CRITERION_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct tcm_test {
  const char *name;
  void (*fn)(void);
} tcm_test;
static tcm_test tcm_tests[64];
static int tcm_n, tcm_failed_expects;
static void (*tcm_init)(void), (*tcm_fini)(void);

static inline void tcm_fail(int fatal, const char *file, int line, const char *expr,
                            const char *fmt, ...) {
  fprintf(stderr, "%s:%d: %s failed: %s: ", file, line, fatal ? "assert" : "expect", expr);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  if (fatal) exit(1);
  tcm_failed_expects++;
}

typedef struct tcm_suite_opts {
  void (*init)(void), (*fini)(void);
} tcm_suite_opts;
#define TestSuite(suite, ...)                                                                      \
  __attribute__((constructor)) static void tcm_suite_##suite(void) {                               \
    tcm_suite_opts o = {__VA_ARGS__};                                                              \
    tcm_init = o.init, tcm_fini = o.fini;                                                          \
  }
#define Test(suite, name)                                                                          \
  static void suite##_##name(void);                                                                \
  __attribute__((constructor)) static void tcm_reg_##suite##_##name(void) {                        \
    tcm_tests[tcm_n++] = (tcm_test){#suite "::" #name, suite##_##name};                            \
  }                                                                                                \
  static void suite##_##name(void)

#define cr_assert(cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) tcm_fail(1, __FILE__, __LINE__, #cond, "" __VA_ARGS__);                           \
  } while (0)
#define cr_expect(cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) tcm_fail(0, __FILE__, __LINE__, #cond, "" __VA_ARGS__);                           \
  } while (0)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_lt(a, b, ...) cr_assert((a) < (b), __VA_ARGS__)
#define cr_expect_eq(a, b, ...) cr_expect((a) == (b), __VA_ARGS__)

static inline int tcm_main(void) {
  for (int i = 0; i < tcm_n; i++) {
    if (tcm_init) tcm_init();
    tcm_tests[i].fn();
    if (tcm_fini) tcm_fini();
    fprintf(stderr, "[PASS] %s\n", tcm_tests[i].name);
  }
  fprintf(stderr, "%d tests, %d failed expectations\n", tcm_n, tcm_failed_expects);
  return tcm_failed_expects != 0;
}

#ifndef TC_OWN_MAIN /* a test with its own main calls tcm_main() */
int main(void) { return tcm_main(); }
#endif

#endif
