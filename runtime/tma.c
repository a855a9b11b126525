// SPDX-License-Identifier: BSD-3-Clause
/* tma.c: the tensor maps that kernels loading by TMA (the Tensor Memory
 * Accelerator of sm_90) take as __grid_constant__ parameters, encoded on
 * the host for each launch through the driver table's
 * cuTensorMapEncodeTiled. */
#include "runtime.h"

ag_status ag_tma_rows_map(const ag_driver *drv, CUtensorMap *out, const void *ptr, int64_t rows,
                          int64_t heads, int head_dim, int box_rows, int l2_bytes,
                          ag_error *err) {
  if (!drv->cuTensorMapEncodeTiled)
    return ag_fail(err, AG_ERR_NO_DRIVER,
                   "this kernel loads by TMA and the CUDA driver lacks cuTensorMapEncodeTiled "
                   "(CUDA 12 or later needed)");
  if (box_rows < 1 || box_rows > 256 || rows < 0 || rows > UINT32_MAX || heads < 1 ||
      heads > UINT32_MAX || (head_dim != 64 && head_dim != 128) ||
      (l2_bytes != 128 && l2_bytes != 256))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "no tensor map for %lld rows x %lld heads x %d in boxes of %d rows "
                   "(L2 promotion %d bytes)",
                   (long long)rows, (long long)heads, head_dim, box_rows, l2_bytes);
  /* Innermost first: the head's elements, the heads, the rows. A map needs
   * a size of at least 1: with no rows nothing is launched that reads it. */
  const cuuint64_t dims[3] = {(cuuint64_t)head_dim, (cuuint64_t)heads,
                              (cuuint64_t)(rows > 0 ? rows : 1)};
  const cuuint64_t strides[2] = {(cuuint64_t)head_dim * 2, (cuuint64_t)(heads * head_dim * 2)};
  /* Boxes of 64 elements (128 bytes, the swizzle's row) by 1 head by
   * box_rows rows: one of the kernels' 64-column matrices. */
  const cuuint32_t box[3] = {64, 1, (cuuint32_t)box_rows}, steps[3] = {1, 1, 1};
  /* What L2 fetches on a miss: 128 bytes is one box row (a head's 64
   * columns), 256 two (at head dim 64 the next head's too). */
  const CUtensorMapL2promotion l2 =
      l2_bytes == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  return ag_cuda_check(
      err,
      drv->cuTensorMapEncodeTiled(out, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, (void *)(uintptr_t)ptr,
                                  dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_128B, l2,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
      "cuTensorMapEncodeTiled");
}
