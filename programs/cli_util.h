/* programs/cli_util.h - what the kvtier subcommands share: exit codes, option
 * parsing, messages, whole-file input and output (atomic replace of files,
 * in-place writes of devices and FIFOs), timing, JSON strings
 * and a small fork/join helper. */
#ifndef KVT_CLI_UTIL_H
#define KVT_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"

/* Exit codes, documented in `kvtier --help`. */
enum {
  CLI_OK = 0,
  CLI_EPAYLOAD = 1, /* payload invalid or corrupt */
  CLI_EUSAGE = 2,   /* bad command line */
  CLI_EIO = 3,      /* a file could not be read or written */
  CLI_EFAIL = 4     /* anything else */
};
/* cli_parse() result when --help was given: print help, exit 0. */
#define CLI_HELP (-1)

typedef enum cli_opt_kind { CLI_FLAG, CLI_STR, CLI_U32, CLI_INT, CLI_DBL } cli_opt_kind;

/* One option. dst is int * (FLAG: set to 1; INT), const char ** (STR),
 * uint32_t * (U32) or double * (DBL). Numbers must lie in [min, max]. */
typedef struct cli_opt {
  const char *name;  /* "--layers" */
  const char *alias; /* "-o", or NULL */
  cli_opt_kind kind;
  void *dst;
  double min, max;
} cli_opt;

/* Parses argv[1..argc) of subcommand `cmd` ("encode", "bench codec"):
 * "--name value", "--name=value", and positional arguments into
 * pos[0..max_pos), their count in *n_pos. Returns 0, CLI_HELP, or CLI_EUSAGE
 * after printing why. */
int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, size_t n_opts,
              const char **pos, size_t max_pos, size_t *n_pos);

/* Prints "kvtier CMD: <message>" and a pointer to --help on stderr; returns
 * CLI_EUSAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints "kvtier: <message>" on stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A GPU command in a build without CUDA: prints help for --help / -h
 * (CLI_OK), else says the build lacks CUDA (CLI_EFAIL). */
int cli_without_cuda(const char *cmd, int argc, char **argv, const char *help);

/* Parses "bf16" or "fp16" into an enum kvt_dtype; -1 when neither. */
int cli_parse_dtype(const char *s);

/* Whether err is one of the codes a bad payload gives. */
int cli_is_payload_error(int err);

/* Reports a payload that failed validation as one line,
 * "PATH: KVT_ECHECKSUM: <detail>", on stderr; returns CLI_EPAYLOAD. */
int cli_report_bad_payload(const char *path, kvt_ctx *ctx, int err);

/* Creates a context with the given SIMD choice, reporting a failure. Returns
 * 0 or an exit code. */
int cli_ctx_create(int simd, kvt_ctx **out);

/* Reads the whole file into a new malloc'd buffer (*buf, *len; free()).
 * Returns 0 or CLI_EIO after printing the file and the cause. */
int cli_read_file(const char *path, void **buf, size_t *len);

/* Like cli_read_file, but the file must hold exactly `expect` bytes; `what`
 * explains the size ("32 layers x 256 tokens x ..."). A size mismatch is
 * reported with both sizes and returns CLI_EUSAGE. */
int cli_read_exact(const char *path, size_t expect, const char *what, void **buf);

/* Writes buf to path, the file an output option names:
 * - a new or regular file (or the file a symlink leads to; the link stays)
 *   atomically: a temporary file beside it (NAME.tmp.XXXXXX, created
 *   exclusively, with the replaced file's permission bits or 0666 less the
 *   umask) is written, fsync'd and renamed over it, and the directory
 *   fsync'd, so a failure never leaves a partial file;
 * - a special file (character or block device, FIFO) in place: opened,
 *   written and closed (only a block device is fsync'd), never replaced;
 *   /dev/null takes the bytes, /dev/full fails with ENOSPC, a FIFO's open
 *   waits for its reader;
 * - a procfs link in place: /dev/stdout, /dev/fd/N (this process's own
 *   descriptor) through a duplicate of it, at its offset, whatever it is
 *   open on (a file the shell appends to stays that file); another procfs
 *   link opened by the kernel (O_TRUNC), never replaced by name;
 * - a symlink another user made in a sticky, world-writable directory
 *   (/tmp), unless the directory is theirs, is not followed (EACCES), as
 *   the kernel's fs.protected_symlinks would refuse it;
 * - a directory, or a socket (which cannot be opened), is an error.
 * Returns 0 or CLI_EIO after printing the path and the cause. */
int cli_write_output(const char *path, const void *buf, size_t len);

/* Writes n outputs as cli_write_output() does, all or none: each is written
 * (special files in place) and closed in turn, and the temporary files are
 * renamed only after every one was written, so a failure leaves no new file
 * and every file that was there as it was (only bytes already sent to a
 * special file, or a rename failing after another succeeded, are not taken
 * back). n is at most CLI_MAX_OUTPUTS. */
#define CLI_MAX_OUTPUTS 4
int cli_write_outputs(const char *const *paths, const void *const *bufs, const size_t *lens,
                      size_t n);

/* Where a command's summary line goes: stderr when one of the n output paths
 * is the file the process's stdout is (-o /dev/stdout, a path naming the same
 * pipe or file), so the line never lands among the output's bytes; stdout
 * otherwise. */
FILE *cli_summary_stream(const char *const *paths, size_t n);

/* An output option's value: the empty path is a usage error (printed,
 * CLI_EUSAGE); 0 otherwise, NULL included. */
int cli_check_output(const char *cmd, const char *opt, const char *path);

/* Whether a and b name the same regular file (one inode, through any
 * symlink or hard link), or, where neither exists, the same new name in
 * the same directory: an output that would replace an input or another
 * output. Special files never count: writing /dev/null twice is fine. */
int cli_same_file(const char *a, const char *b);

/* Allocates n bytes aligned to 64 and touches every page, so timing does not
 * include page faults. NULL on failure (after printing). Free with free(). */
void *cli_alloc_faulted(size_t n);

/* Seconds from CLOCK_MONOTONIC. */
double cli_now(void);

/* Writes s as a JSON string literal (quotes and escapes included). */
void cli_json_str(FILE *f, const char *s);

/* Runs fn(arg, i, n) for every i in [0, n), each on its own thread (the
 * caller's runs i = 0), and joins them. An index whose thread cannot be
 * started runs on the caller's thread, so every index always runs. */
void cli_parallel(unsigned n, void (*fn)(void *arg, unsigned i, unsigned n), void *arg);

/* Online CPUs, at least 1. */
unsigned cli_cpu_count(void);

/* The CPU's model name from /proc/cpuinfo into buf ("unknown" if none). */
void cli_cpu_model(char *buf, size_t cap);

/* Median of n doubles (sorts v in place). */
double cli_median(double *v, size_t n);

/* 16-bit patterns of dtype to float, through a 65536-entry table. */
typedef struct cli_f16_table {
  float v[65536];
} cli_f16_table;
void cli_f16_table_fill(cli_f16_table *t, int dtype);

/* Subcommands: argv[0] is the subcommand's name; each returns an exit code. */
int cli_encode_main(int argc, char **argv);
int cli_decode_main(int argc, char **argv);
int cli_inspect_main(int argc, char **argv);
int cli_verify_main(int argc, char **argv);
int cli_demo_main(int argc, char **argv);
int cli_bench_main(int argc, char **argv);
int cli_store_main(int argc, char **argv);
int cli_quality_main(int argc, char **argv); /* runs python -m kvtier.quality */

#endif
