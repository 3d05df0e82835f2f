"""tpu/hlo_costs.py: collective bytes read off compiled HLO text (loops included) and the roofline arithmetic."""
import pytest

import script_module

costs = script_module.load("tpu/hlo_costs.py")

# The shapes of XLA's TPU output: collectives inside fusions, mesh-style and explicit replica groups, an
# all-reduce-scatter computation, an async collective-permute, a scanned layer (while loop of 12 trips) holding a
# windowed matmul (a u32-bounded loop of 8 trips), and one all-to-all written twice under one channel (an async
# collective's start and the fusion overlapping it).
HLO = """HloModule jit_train_step

%all-reduce-scatter.1 (p: bf16[64,128]) -> bf16[16,128] {
  %all-reduce.3 = bf16[64,128]{1,0} all-reduce(%p), channel_id=3, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}, to_apply=%add
}

%body (param: (s32[], f32[128,128])) -> (s32[], f32[128,128]) {
  %all-gather.1 = f32[128,128]{1,0} all-gather(%x), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}
  %while.2 = (u32[], bf16[16]) while(%t2), condition=%windowed_cond, body=%windowed_body
}

%windowed_body (p2: (u32[], bf16[16])) -> (u32[], bf16[16]) {
  %collective-permute-start.2 = (bf16[16]{0}, bf16[16]{0}, u32[], u32[]) collective-permute-start(%w), channel_id=6, source_target_pairs={{0,1},{1,0}}
}

%windowed_cond (p3: (u32[], bf16[16])) -> pred[] {
  %constant.4 = u32[]{:T(128)} constant(8)
  ROOT %lt.2 = pred[] compare(%g, %constant.4), direction=LT
}

%async_collective_fusion.1 (q: f32[8,16]) -> f32[8,16] {
  %all-to-all.2 = f32[8,16]{1,0} all-to-all(%q), channel_id=5, replica_groups=mesh['axis_0'=8] {'axis_0'}, dimensions={0}
}

%cond (param.1: (s32[], f32[128,128])) -> pred[] {
  %constant.9 = s32[]{:T(128)} constant(12)
  ROOT %lt = pred[] compare(%gte, %constant.9), direction=LT
}

ENTRY %main (a: f32[1000]) -> f32[1000] {
  %all-reduce.1 = (f32[1000]{0}, bf16[10]{0}) all-reduce(%a, %b), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %fusion.1 = bf16[16,128]{1,0} fusion(%c), kind=kCustom, calls=%all-reduce-scatter.1
  %while.1 = (s32[], f32[128,128]) while(%t), condition=%cond, body=%body
  %collective-permute-start = (bf16[4,8]{1,0}, bf16[4,8]{1,0}, u32[], u32[]) collective-permute-start(%d), channel_id=4, source_target_pairs={{0,1},{1,0}}
  %all-to-all = f32[8,16]{1,0} all-to-all(%e), channel_id=5, replica_groups=mesh['axis_0'=8] {'axis_0'}, dimensions={0}
}
"""


def test_collective_bytes_per_kind():
  sent = costs.collective_bytes(HLO, num_devices=8)
  assert sent["all-reduce"] == pytest.approx(2 * 7 / 8 * (4000 + 20))
  assert sent["reduce-scatter"] == pytest.approx(3 / 4 * 64 * 128 * 2)  # a group of 4 (axis_0)
  assert sent["all-gather"] == pytest.approx(12 * 3 / 4 * 128 * 128 * 4)  # once per trip, groups of 4
  assert sent["collective-permute"] == 4 * 8 * 2 + 12 * 8 * 16 * 2  # the async one, and 12 x 8 windowed trips
  assert sent["all-to-all"] == pytest.approx(7 / 8 * 8 * 16 * 4)


def test_roofline_and_splash_flops():
  chip = costs.CHIPS["v5e"]
  roof = costs.roofline(chip, flops=197e12 * 0.5, bytes_accessed=819e9 * 0.2, ici_bytes=200e9 * 0.3,
                        model_flops=197e12 * 0.4)
  assert roof["compute_s"] == pytest.approx(0.5) and roof["memory_s"] == pytest.approx(0.2)
  assert roof["ici_s"] == pytest.approx(0.3)
  assert roof["step_s_overlapped"] == pytest.approx(0.5) and roof["step_s_serial"] == pytest.approx(0.8)
  assert roof["mfu_overlapped"] == pytest.approx(0.8) and roof["mfu_serial"] == pytest.approx(0.5)
  # Lengths pad to splash's 128-wide blocks.
  assert costs.splash_flops(batch_rows=2, length=100, hidden=768, layers=12) == 9 * 2 * 128 ** 2 * 768 * 12 * 2


def test_a_sliding_window_layers_splash_flops_are_its_non_empty_tiles():
  # 2,048 tokens in blocks of 512, 64 tokens each side: a query block reaches its neighbours only, 10 of 16 tiles.
  tile = 9 * 2 * 512 ** 2 * 64
  assert costs.splash_flops(1, 2048, 64, 2, windows=(None, 64), block=512) == (16 + 10) * tile
  # Each side's reach crosses a block boundary at window 513: two neighbours each side, 14 of 16.
  assert costs.splash_flops(1, 2048, 64, 1, windows=(513,), block=512) == 14 * tile
  # At 1,024 tokens the window already touches both blocks: the local layer costs the global one's work.
  assert costs.splash_flops(1, 1024, 64, 2, windows=(None, 64), block=512) == 2 * 4 * tile
