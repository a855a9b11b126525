@# SPDX-License-Identifier: BSD-3-Clause
@# block_bwd_scale.cuh: the softmax scale as the block-diagonal backwards
@# take it (block_bwd.cu, block_bwd_chunked.cu): where dS carries it and
@# what the gradient stores still multiply by.
@# Placeholders: @SCALE@ (a float literal) @SCALE_LOG2@ (scale * log2(e))
@#   @SCALE_TEXT@ (the scale as the spec gave it, for a comment).
@# Conditions: SCALE_IN_DS (bf16: the scale rides in dS).
constexpr float kScale = @SCALE@;  // softmax scale @SCALE_TEXT@
constexpr float kScaleLog2 = @SCALE_LOG2@;  // the scale times log2(e)
@if SCALE_IN_DS@
// dS is rounded with the scale in it: bf16 has fp32's exponent range, so
// that costs nothing, and no gradient store multiplies.
constexpr float kDsScale = kScale;
constexpr float kStoreScale = 1.f;  // what dQ and dK still take when stored
@else@
// dS is rounded without the scale, and dQ and dK take it in fp32 as they
// are stored: scaled first, small dS values would sink into fp16's
// subnormals (the scale is 1/8 at head_dim 64).
constexpr float kDsScale = 1.f;
constexpr float kStoreScale = kScale;  // what dQ and dK still take when stored
@endif@
