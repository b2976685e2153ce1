"""The report writer: complete JSON, Markdown and PNG from a small synthetic result set."""

import json

from v4serve.bench.metrics import RequestRecord, compute_point_metrics
from v4serve.bench.report import SCHEMA, agentic_document, load_documents, plot_runs, write_agentic_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _point(concurrency: int, itl: float, prompt: int) -> dict:
    recs = [
        RequestRecord(
            lane=i,
            session_id="s",
            conv_id="c",
            turn=i,
            phase="measured",
            start_s=0.1 * i,
            ok=True,
            ttft_s=0.2,
            itl_s=[itl] * 9,
            e2el_s=0.2 + 9 * itl,
            prompt_tokens=prompt,
            completion_tokens=10,
            cached_tokens=prompt - 100,
            expected_output_tokens=10,
            reusable_tokens=prompt - 90,
        )
        for i in range(concurrency * 3)
    ]
    return compute_point_metrics(
        recs, concurrency, num_gpus=2, duration_s=10.0, max_inflight=concurrency
    ).to_dict()


def _doc(label: str, scale: float = 1.0) -> dict:
    points = [
        _point(1, 0.004, int(5000 * scale)),
        _point(4, 0.008, int(5000 * scale)),
        _point(16, 0.03, int(5000 * scale)),
    ]
    return agentic_document(
        points=points,
        model="tiny",
        base_url="http://127.0.0.1:1",
        server_models={"data": [{"id": "tiny"}]},
        num_gpus=2,
        config={"duration_s": 10.0},
        trace={"source": "synthetic", "stats": {"input_median": 5000.0}},
        command=["v4serve", "bench", "agentic"],
        started_at=1_800_000_000.0,
        wall_s=31.0,
        slo_interactivity=(150.0, 50.0),
        label=label,
    )


def test_document_is_complete():
    doc = _doc("run-a")
    assert doc["schema"] == SCHEMA
    for key in (
        "label",
        "created",
        "command",
        "base_url",
        "model",
        "server_models",
        "num_gpus",
        "config",
        "trace",
        "points",
        "slo",
        "wall_s",
    ):
        assert key in doc
    # p90 interactivity: 250, 125, 33.3 tok/s/user -> SLO 150 picks c1, SLO 50 picks c4.
    assert [s["best"]["concurrency"] for s in doc["slo"]] == [1, 4]
    point = doc["points"][0]
    for key in (
        "tpgs",
        "interactivity_p50",
        "interactivity_p90",
        "ttft_ms",
        "tpot_ms",
        "e2el_ms",
        "hit_rate",
        "theoretical_hit_rate",
        "error_rate",
        "requests_completed",
    ):
        assert key in point


def test_writes_json_markdown_png_and_records(tmp_path):
    doc = _doc("run-a")
    recs = [RequestRecord(0, "s", "c", 0, "measured", 0.0, True)]
    paths = write_agentic_report(doc, tmp_path / "out", overlays=[_doc("run-b", 0.5)], records=recs)
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(doc))
    md = paths["markdown"].read_text()
    assert "| conc |" in md and md.count("\n| ") == 1 + 3  # header + one row per point
    assert "p90 interactivity >= 150 tok/s/user: best TPGS" in md
    assert "at concurrency 4" in md
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC
    assert json.loads(paths["records"].read_text().splitlines()[0])["phase"] == "measured"


def test_overlay_plot_from_saved_documents(tmp_path):
    files = []
    for name in ("on", "off"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(_doc(name)))
        files.append(path)
    docs = load_documents(files, ["replay on", "replay off"])
    assert [d["label"] for d in docs] == ["replay on", "replay off"]
    out = plot_runs(docs, tmp_path / "overlay.png", title="on vs off")
    assert out.read_bytes()[:8] == PNG_MAGIC
