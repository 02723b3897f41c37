/* src/core/error.c — sticky thread-local errors and status strings. */
#include "nbi.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local nb_status err_status = NB_OK;
static _Thread_local char err_msg[1024];
static _Thread_local const char *err_context; /* the public composite running, or NULL */

static const char *const status_strs[NB_STATUS_COUNT] = {
#define NB_STATUS_STR_(name, msg) msg,
    NB_STATUS_MAP(NB_STATUS_STR_)
#undef NB_STATUS_STR_
};

const char *nb_status_str(nb_status s) {
  if ((unsigned)s >= NB_STATUS_COUNT) return "unknown status";
  return status_strs[s];
}

nb_status nb_last_status(void) { return err_status; }
const char *nb_last_error(void) { return err_status == NB_OK ? "" : err_msg; }
void nb_clear_error(void) {
  err_status = NB_OK;
  err_msg[0] = '\0';
}

nb_status nbi_error(nb_status s, const char *fmt, ...) {
  if (err_status != NB_OK || s == NB_OK) return s; /* keep the first error */
  err_status = s;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  size_t n = err_context ? strlen(err_context) : 0;
  if (n && n + 2 < sizeof err_msg && (strncmp(err_msg, err_context, n) || err_msg[n] != ':')) {
    /* "ctx: " in front of the message, which moves right (its tail may be cut) */
    size_t len = strlen(err_msg), room = sizeof err_msg - 1 - (n + 2);
    len = len < room ? len : room;
    memmove(err_msg + n + 2, err_msg, len);
    memcpy(err_msg, err_context, n);
    err_msg[n] = ':', err_msg[n + 1] = ' ', err_msg[n + 2 + len] = '\0';
  }
  const char *abort_env = getenv("NABLA_ABORT_ON_ERROR");
  if (abort_env && abort_env[0] == '1') {
    fprintf(stderr, "nabla: %s (%s)\n", err_msg, nb_status_str(s));
    abort();
  }
  return s;
}

const char *nbi_error_context_begin(const char *fn) {
  const char *outer = err_context;
  if (!outer) err_context = fn;
  return outer;
}

void nbi_error_context_end(const char *outer) { err_context = outer; }

bool nbi_any_null(const char *fn, nb_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++) {
    if (!ts[i]) {
      nbi_error(NB_ERR_NULL, "%s: argument %d is NULL", fn, i + 1);
      return true;
    }
  }
  return false;
}

nb_status nb_set_error(nb_status s, const char *fmt, ...) {
  if (s == NB_OK || nb_last_status() != NB_OK) return s;
  if (!fmt) return nbi_error(s, "%s", nb_status_str(s));
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return nbi_error(s, "%s", msg);
}
