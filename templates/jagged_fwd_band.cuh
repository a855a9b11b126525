@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_fwd_band.cuh: the softmax scale and the causal/window band as the
@# three jagged forwards take them (jagged_fwd.cu, jagged_fwd_sm90.cu,
@# jagged_fwd_ws.cu): the spec's values and the band's bounded sides, its
@# edges 64-bit (the backwards' jagged_bwd_band.cuh keeps int edges).
@# Placeholders: @SCALE_LOG2@ @SCALE_TEXT@ @CAUSAL@ @WINDOW@ @WINDOW_LEFT@
@#   @WINDOW_RIGHT@ @BROADCAST@. No conditions.
constexpr float kScaleLog2 = @SCALE_LOG2@;  // softmax scale @SCALE_TEXT@ times log2(e)
constexpr bool kCausal = @CAUSAL@;  // bottom-right aligned: key j <= query i + Lk - Lq
constexpr bool kWindow = @WINDOW@;  // keys in [i + Lk - Lq - left, i + Lk - Lq + right]
constexpr int kWindowLeft = @WINDOW_LEFT@;
constexpr int kWindowRight = @WINDOW_RIGHT@;
constexpr bool kBroadcast = @BROADCAST@;  // one Q shared by every sequence
// Which sides of the band bound the keys a query sees.
constexpr bool kHasLeft = kWindow && kWindowLeft >= 0;
constexpr bool kHasRight = kCausal || (kWindow && kWindowRight >= 0);
constexpr long long kRight = kCausal ? 0 : (long long)kWindowRight;
constexpr long long kLeft = (long long)kWindowLeft;
static_assert(!(kCausal && kWindow && kWindowRight > 0), "causal with a window means right 0");
