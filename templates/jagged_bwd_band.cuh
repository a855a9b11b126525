@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_band.cuh: the softmax scale and the causal/window band as the
@# jagged backward kernels take them (jagged_bwd.cu, jagged_bwd_sm90.cu,
@# broadcast_bwd.cu; jagged_bwd_tile.cuh's masks read them). The forwards
@# keep their own: their band edges are 64-bit.
@# Placeholders: @SCALE@ @SCALE_LOG2@ @SCALE_TEXT@ @CAUSAL@ @WINDOW@
@#   @WINDOW_LEFT@ @WINDOW_RIGHT@. No conditions.
constexpr float kScale = @SCALE@;  // softmax scale @SCALE_TEXT@
constexpr float kScaleLog2 = @SCALE_LOG2@;  // the scale times log2(e)
constexpr float kLog2e = 1.4426950408889634f;
constexpr bool kCausal = @CAUSAL@;
constexpr bool kWindow = @WINDOW@;
constexpr int kWindowLeft = @WINDOW_LEFT@;  // keys before the diagonal a query sees
constexpr int kWindowRight = @WINDOW_RIGHT@;  // keys after it
constexpr bool kHasLeft = kWindow && kWindowLeft >= 0;  // the band has a lower edge
constexpr bool kHasRight = kCausal || (kWindow && kWindowRight >= 0);  // and an upper one
constexpr int kRight = kCausal ? 0 : kWindowRight;  // the upper edge, where kHasRight
