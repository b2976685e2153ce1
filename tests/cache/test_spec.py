"""Cache accounting: what each layer stores and what it costs, against the published per-token figures
(spec §4.4-4.6), and that KVPools allocates exactly what the spec accounts for."""

from __future__ import annotations

import pytest

from v4serve.cache.pool import KVPools
from v4serve.cache.spec import make_cache_spec
from v4serve.presets import get_preset


@pytest.mark.parametrize("preset,kv,index,per_token", [
    ("v4-flash", "bf16", "bf16", 6880.0),  # 21 x (256 + 64) + 20 x 8
    ("v4-flash", "fp8", "fp8", 3850.25),  # 21 x (146 + 33) + 20 x 4.5625
    ("v4-flash", "fp8", None, 3514.25),  # FP4 index keys are the default with an FP8 cache: 21 x (146 + 17) + ...
    ("v4-pro", "bf16", "bf16", 9848.0),  # 30 x 320 + 31 x 8  (9.62 GiB per 1M tokens)
    ("v4-pro", "fp8", "fp8", 5511.4375),
    ("v4-pro", "fp8", "fp4", 5031.4375),
    ("v41-flash", "fp4", None, 890.0),  # 2.5 entries/token x (288 + 68)
    ("v41-flash", "bf16", "bf16", 3200.0),
])
def test_bytes_per_token_reproduce_the_published_figures(preset, kv, index, per_token):
    spec = make_cache_spec(get_preset(preset), block_size=256, kv_dtype=kv, index_dtype=index)
    assert spec.bytes_per_token() == per_token
    assert spec.compressed_bytes_per_token() + spec.index_bytes_per_token() == per_token
    assert spec.block_bytes() == per_token * 256  # a block holds exactly block_size positions' worth
    assert spec.by_kind()["total_per_token"] == per_token


def test_v4_flash_per_layer_records_and_constant_per_sequence_state():
    c = get_preset("v4-flash")
    spec = make_cache_spec(c, block_size=256, kv_dtype="fp8", with_mtp=True)
    assert spec.index_dtype == "fp4"
    assert len(spec.layers) == 44  # 43 layers + the MTP block's window
    csa = [lc for lc in spec.layers if lc.ratio == 4]
    hca = [lc for lc in spec.layers if lc.ratio == 128]
    assert len(csa) == 21 and len(hca) == 20
    assert all(lc.compressed.record_bytes == 584 and lc.index_keys.record_bytes == 68 for lc in csa)
    assert all(lc.index_keys is None for lc in hca)
    assert all(lc.window.record_bytes == 584 for lc in spec.layers)
    # compressor state (float32 kv + score): CSA 2 x [8, 1024], its indexer 2 x [8, 256], HCA 2 x [128, 512]
    assert {lc.state.bytes for lc in csa} == {64 << 10} and {lc.index_state.bytes for lc in csa} == {16 << 10}
    assert {lc.state.bytes for lc in hca} == {512 << 10} and all(lc.index_state is None for lc in hca)
    assert spec.state_bytes_per_seq() == 21 * (80 << 10) + 20 * (512 << 10)  # ~11.6 MiB
    assert spec.window_bytes_per_seq() == 44 * 128 * 584  # 3.29 MB
    assert spec.slot_bytes() == spec.window_bytes_per_seq() + spec.state_bytes_per_seq()


def test_v41_flash_only_kv_sources_own_compressed_caches():
    c = get_preset("v41-flash")
    spec = make_cache_spec(c, block_size=256, kv_dtype="fp4", with_mtp=True)
    owners = [lc.layer for lc in spec.layers if lc.compressed is not None]
    assert owners == [2, 8, 14, 20]
    assert [lc.compressed.record_bytes for lc in spec.layers if lc.compressed] == [288] * 4
    assert [lc.index_keys.record_bytes for lc in spec.layers if lc.compressed] == [68] * 4
    assert spec.layers[20].state is None  # ratio 1: each position is its own entry, no partial group
    assert spec.window_bytes_per_seq() == 43 * 128 * 528


def test_block_size_must_be_a_multiple_of_every_ratio():
    with pytest.raises(ValueError, match="block-size"):
        make_cache_spec(get_preset("v4-flash"), block_size=64)  # HCA ratio 128
    make_cache_spec(get_preset("tiny-v4-flash"), block_size=64)  # tiny ratios 4 and 8 fit


@pytest.mark.parametrize("kv", ["auto", "bf16", "fp8"])
@pytest.mark.parametrize("preset", ["tiny-v4-flash", "tiny-v4-pro"])
def test_pools_allocate_what_the_spec_accounts_for(preset, kv):
    c = get_preset(preset)
    spec = make_cache_spec(c, block_size=64, kv_dtype=kv, with_mtp=True)
    pools = KVPools(spec, num_blocks=5, num_slots=3)
    # one trash block and one trash slot beyond the requested ones
    assert pools.nbytes == 6 * spec.block_bytes() + 4 * spec.slot_bytes()
    for lc in spec.layers:
        assert pools.window[lc.layer].data.shape == (4 * c.window_size, lc.window.row_width)
        if lc.compressed is not None:
            epb = 64 // lc.ratio
            assert pools.compressed[lc.layer].data.shape == (6 * epb, lc.compressed.row_width)
            assert pools.state[lc.layer].kv.shape == (4, lc.state.slots, lc.state.width)
    assert set(pools.compressed) == set(c.compressed_layers)
    assert set(pools.index_keys) == {i for i in c.compressed_layers if c.ratio(i) == 4}
