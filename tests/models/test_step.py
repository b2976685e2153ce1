"""models/step.py: a step's rows packed into one int64 tensor (one copy to the device) and unpacked as views."""

from __future__ import annotations

import pytest
import torch

from v4serve.models.step import RowSpec, StepLayout, build_step, pack_step


def _rows() -> list[RowSpec]:
    return [
        RowSpec([5, 6, 7], 10, slot=3, blocks=[4, 9], window_floor=2, cached_len=8, decoder_floor=1, logits="all",
                logits_from=11),
        RowSpec([8], 40, slot=0, blocks=[1, 2, 3]),  # a decode row
        RowSpec([1, 2], 0, slot=5, blocks=[], logits="none"),  # a prefill chunk that samples nothing
    ]


def test_every_field_as_the_rows_say() -> None:
    step = build_step(_rows())
    assert step.token_ids.tolist() == [5, 6, 7, 8, 1, 2]
    assert step.positions.tolist() == [10, 11, 12, 40, 0, 1]
    assert step.token_row.tolist() == [0, 0, 0, 1, 2, 2]
    assert step.row_slot.tolist() == [3, 0, 5] and step.row_start.tolist() == [10, 40, 0]
    assert step.row_len.tolist() == [3, 1, 2] and step.row_offset.tolist() == [0, 3, 4]
    assert step.window_floor.tolist() == [2, 0, 0] and step.cached_len.tolist() == [8, 0, 0]
    assert step.decoder_floor.tolist() == [1, 0, 0]
    assert step.logits_index.tolist() == [1, 2, 3]  # row 0 from position 11 on, row 1 its last, row 2 none
    assert step.block_table.tolist() == [[4, 9, -1], [1, 2, 3], [-1, -1, -1]]
    assert step.max_context == 41 and step.num_tokens == 6 and step.num_rows == 3
    assert all(t.dtype == torch.int64 for t in (step.token_ids, step.block_table, step.logits_index))


def test_one_buffer_views_and_a_wider_table() -> None:
    packed, layout = pack_step(_rows(), width=5)
    # each field padded to 2 elements: 3 rows and 3 logits indices take 4 each
    assert layout == StepLayout(6, 3, 3, 5) and packed.numel() == layout.size == 3 * 6 + 7 * 4 + 4 + 15
    step = layout.unpack(packed, max_context=64)
    base = packed.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in (step.token_ids, step.row_slot, step.block_table,
                                                                 step.logits_index))
    assert step.block_table.tolist() == [[4, 9, -1, -1, -1], [1, 2, 3, -1, -1], [-1] * 5]
    with pytest.raises(ValueError, match="more than the table's 2 columns"):
        pack_step(_rows(), width=2)


@pytest.mark.parametrize("tokens,rows", [(1, 1), (5, 3), (6, 1), (7, 2)])
def test_every_field_starts_on_16_bytes(tokens: int, rows: int) -> None:
    # Triton compiles a variant per pointer alignment: a field's start must not depend on the step's T and R
    rows_ = [RowSpec(slot=r, start=0, token_ids=[1] * (tokens - rows + 1 if r == 0 else 1), blocks=[r], logits="last")
             for r in range(rows)]
    packed, layout = pack_step(rows_)
    step = layout.unpack(packed, max_context=64)
    fields = [step.token_ids, step.positions, step.token_row, step.logits_index, step.block_table,
              *(getattr(step, f) for f in StepLayout.ROW_FIELDS)]
    assert all(f.data_ptr() % 16 == 0 and f.is_contiguous() for f in fields)
    assert step.token_ids.numel() == tokens and step.row_len.tolist() == [tokens - rows + 1] + [1] * (rows - 1)
    assert step.token_row.tolist() == [0] * (tokens - rows + 1) + list(range(1, rows))
