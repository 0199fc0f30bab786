/* bench/cli_bench_tier.h - `kvtier bench tier` (cli_bench_tier.c) and
 * `kvtier bench cache` (cli_bench_cache.c). */
#ifndef KVT_CLI_BENCH_TIER_H
#define KVT_CLI_BENCH_TIER_H

/* argv[0] is "tier"; returns an exit code. */
int cli_bench_tier_main(int argc, char **argv);

/* argv[0] is "cache"; returns an exit code. */
int cli_bench_cache_main(int argc, char **argv);

#endif
