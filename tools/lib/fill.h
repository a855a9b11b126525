// SPDX-License-Identifier: BSD-3-Clause
/* fill.h: the self-checks' random inputs and rotary tables. Each value is a
 * counter-based hash of (seed, stream, element), so any element can be
 * regenerated on demand (the samples the reference reads) and the data do
 * not depend on how many host threads made them. Part of the tools library. */
#ifndef AG_FILL_H
#define AG_FILL_H

#include <stdint.h>

#include "attngen.h"

/* Element e of stream `which` as a value in [-2, 2). */
float ag_input_value(uint64_t seed, int which, uint64_t e);

/* Element (t, col) of a rotary table [tokens, dim] from stream `which`: the
 * sine (column i < dim / 2) or cosine (column dim / 2 + i), in the dtype,
 * of an angle in [-pi, pi) drawn for each (token t, pair i). */
uint16_t ag_table_value(uint64_t seed, int which, ag_dtype dtype, int dim, uint64_t t, int col);

/* dst[i] = ag_input_value(seed, which, at + i) * scale in the dtype, for
 * i < n, by host threads (as many as the machine has online, up to 32). */
void ag_fill_inputs(uint16_t *dst, ag_dtype dtype, uint64_t seed, int which, float scale,
                    uint64_t at, uint64_t n);

/* dst[i] = ag_table_value(seed, which, dtype, dim, (at + i) / dim, (at + i)
 * % dim) for i < n: elements [at, at + n) of the table, by host threads. */
void ag_fill_table(uint16_t *dst, ag_dtype dtype, uint64_t seed, int which, int dim,
                   uint64_t at, uint64_t n);

#endif
