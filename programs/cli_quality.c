/* programs/cli_quality.c - `kvtier quality`: runs the Python tool
 * kvtier.quality (python/kvtier/quality.py), which needs torch and
 * transformers: what each codec does to a real model's predictions.
 *
 * The Python is $KVT_PYTHON, else the venv of `./bootstrap.sh vllm`
 * ($KVT_VLLM_VENV or ~/.cache/kvtier/venv-vllm), else python3 on PATH. This
 * build's python/ directory goes first on PYTHONPATH and its libkvtier.so into
 * KVTIER_LIBRARY when they exist and those are not set, so a build tree runs
 * the package and library it built. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"

#ifndef KVT_PYTHON_DIR
#define KVT_PYTHON_DIR ""
#endif
#ifndef KVT_LIBRARY_FILE
#define KVT_LIBRARY_FILE ""
#endif

/* The Python to run, in buf. */
static const char *python_path(char *buf, size_t cap) {
  const char *p = getenv("KVT_PYTHON");
  if (p && *p)
    return p;
  const char *venv = getenv("KVT_VLLM_VENV");
  const char *home = getenv("HOME");
  if (venv && *venv)
    snprintf(buf, cap, "%s/bin/python", venv);
  else
    snprintf(buf, cap, "%s/.cache/kvtier/venv-vllm/bin/python", home && *home ? home : "/root");
  return access(buf, X_OK) == 0 ? buf : "python3";
}

int cli_quality_main(int argc, char **argv) {
  char pybuf[4096], path[8192];
  const char *py = python_path(pybuf, sizeof(pybuf));
  char init[4200];
  snprintf(init, sizeof(init), "%s/kvtier/quality.py", KVT_PYTHON_DIR);
  if (KVT_PYTHON_DIR[0] && access(init, R_OK) == 0) {
    const char *old = getenv("PYTHONPATH");
    snprintf(path, sizeof(path), "%s%s%s", KVT_PYTHON_DIR, old && *old ? ":" : "",
             old && *old ? old : "");
    setenv("PYTHONPATH", path, 1);
  }
  if (KVT_LIBRARY_FILE[0] && !getenv("KVTIER_LIBRARY") && access(KVT_LIBRARY_FILE, R_OK) == 0)
    setenv("KVTIER_LIBRARY", KVT_LIBRARY_FILE, 1);
  char **args = calloc((size_t)argc + 3, sizeof(*args));
  if (!args) {
    fprintf(stderr, "kvtier quality: out of memory\n");
    return CLI_EFAIL;
  }
  args[0] = (char *)py;
  args[1] = "-m";
  args[2] = "kvtier.quality";
  for (int i = 1; i < argc; i++)
    args[i + 2] = argv[i];
  fflush(stdout);
  execvp(py, args);
  fprintf(stderr,
          "kvtier quality: cannot run %s: %s\n"
          "It needs a Python with torch and transformers: './bootstrap.sh vllm' makes one\n"
          "(~/.cache/kvtier/venv-vllm), or set KVT_PYTHON.\n",
          py, strerror(errno));
  free(args);
  return CLI_EFAIL;
}
