/* programs/kvtier.c - the kvtier command-line tool: dispatch to subcommands,
 * top-level help and version. Each subcommand lives in programs/cli_*.c. */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"

int cli_project_main(int argc, char **argv); /* bench/cli_project.c */


static const char usage[] =
    "Usage: kvtier COMMAND [OPTIONS]    ('kvtier COMMAND --help' for its options)\n"
    "\n"
    "Encode engine KV caches into compact, checksummed kvtier payloads and back.\n"
    "\n"
    "Commands:\n"
    "  encode       encode raw K and V files into a payload with a codec spec\n"
    "  decode       decode a payload back into raw K and V files\n"
    "  inspect      print a payload's header and section table (--json)\n"
    "  verify       check a payload completely: header, every section checksum\n"
    "  demo         encode synthetic Llama-3.1-8B-shaped KV with every preset and\n"
    "               report bytes, element errors and attention-output error\n"
    "  bench codec  single-thread encode/decode throughput against memcpy\n"
    "  bench tier   tier PUT/GET throughput against memcpy (dram) or fio (nvme)\n"
    "  bench cache  prefix lookup time over a long context\n"
    "  bench gpu    fused GPU load/store against cudaMemcpy (CUDA builds)\n"
    "  bench offload GPU cache -> dram -> nvme tiers and back, verified (CUDA builds)\n"
    "  bench attn   decode attention over compressed caches (CUDA builds)\n"
    "  bench redis  the redis tier against redis-benchmark (hiredis builds)\n"
    "  bench fabric the fabric tier against fi_pingpong (libfabric builds)\n"
    "  store        put, get, rm, ls and stats on a cache of tiers (--tiers 'SPEC;SPEC')\n"
    "  project      the bandwidth model: KV bytes per token and step, link shortfall,\n"
    "               break-even, ITL and saturation fits, placement advice\n"
    "  quality      what each codec does to a real model's predictions (the Python\n"
    "               tool kvtier.quality: torch and transformers, './bootstrap.sh vllm')\n"
    "\n"
    "Codec specs:\n"
    "  raw | k16v8 | fp8 | int8 | k16v4 | k8v4 | int4, or the general form\n"
    "  k=FMT,v=FMT[,group=N][,scale=token|block|layer][,block=N][,kgroup=dim|token]\n"
    "  [,raw=LAYERS] with FMT one of n16 e4m3 i8 i4; a preset takes options too\n"
    "  ('k16v8,raw=0,31', 'int4,kgroup=dim').\n"
    "\n"
    "Options:\n"
    "  -h, --help     this text\n"
    "  --version      tool and library versions, built-in features\n"
    "\n"
    "Exit status:\n"
    "  0  success\n"
    "  1  the payload is invalid, corrupt or foreign (verify, inspect, decode,\n"
    "     store), or a key is not found (store)\n"
    "  2  usage error: bad option or value, or an input file whose size does not\n"
    "     match the shape given\n"
    "  3  I/O error: a file could not be read or written (/dev/full included)\n"
    "  4  any other failure (data that cannot be encoded, out of memory, ...)\n"
    "\n"
    "Output files: a new or regular file, or a symlink's target, is replaced\n"
    "atomically (a temporary file beside it, fsync, rename); a device or FIFO is\n"
    "written in place and never replaced.\n";

#define STR_(x) #x
#define STR(x) STR_(x)

/* The tool's version is the header it was built with; the library's is the
 * one linked (they differ only if a shared library was swapped). */
static int version(void) {
  printf("kvtier %s (library %s, payload format %d; zstd: %s, avx2: %s, cuda: %s)\n",
         STR(KVT_VERSION_MAJOR) "." STR(KVT_VERSION_MINOR) "." STR(KVT_VERSION_PATCH),
         kvt_version_string(), KVT_FORMAT_VERSION, kvt_has_feature("zstd") ? "yes" : "no",
         kvt_has_feature("avx2") ? "yes" : "no", kvt_has_feature("cuda") ? "yes" : "no");
  return CLI_OK;
}

int main(int argc, char **argv) {
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {
      {"encode", cli_encode_main}, {"decode", cli_decode_main}, {"inspect", cli_inspect_main},
      {"verify", cli_verify_main}, {"demo", cli_demo_main},     {"bench", cli_bench_main},
      {"store", cli_store_main},        {"project", cli_project_main},
      {"quality", cli_quality_main},
  };
  if (argc < 2) {
    fputs(usage, stderr);
    return CLI_EUSAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(usage, stdout);
    return CLI_OK;
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0)
    return version();
  for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
    if (strcmp(cmd, cmds[i].name) == 0)
      return cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "kvtier: unknown command '%s'\nTry 'kvtier --help'.\n", cmd);
  return CLI_EUSAGE;
}
