/* programs/kvtier.c - the kvtier command-line tool (placeholder until the CLI lands). */
#include <stdio.h>
int main(void) { puts("kvtier: CLI under construction"); return 0; }
