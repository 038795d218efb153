"""Typed views of the stored artifact analyses (Artifact.analysis): msgspec Structs decoded leniently.

The parsers in jobs.profiling write plain JSON dicts (kept as stored: no migration); the diagnosis rules
and pages read them through these Structs, so a reader names fields instead of walking
`dict[str, Any]` paths. Only the blocks something reads are declared; everything else in the stored
JSON is ignored.

Decoding is lenient because analyses stored by older parser versions (or partial parses) lack keys or
carry other types: a missing key or a value of the wrong type reads as the field's default (None for
numbers and text, [] for lists, an empty block for a nested block), a list entry of the wrong shape is
dropped, unknown keys are ignored, a non-finite number reads as None. Decoding never raises on stored
data. This differs from jobs.evaluation.schema, whose one writer is ours and whose payload is refused
whole when it does not fit.

Units are the parsers' own (see jobs.profiling.trace_analysis, nsys_stats, ncu, pyspy, monitoring):
`*_pct` are percentages (0-100) of the basis the block states, `*_ms`/`*_us` milliseconds/microseconds,
`*_unix` seconds since the epoch.

One module per kind of artifact, each with its decoder (import from the module itself; this package
re-exports nothing, so a reader finds a Struct where it is declared):

- common: the lenient decoder (`lenient`), the finite number type (`Num`), `declared_paths`;
- blocks: blocks several kinds share (`Capture`, `NamedTime`, `TensorCores`) and `decode_capture`;
- trace: trace analyses (Kineto JSON, Nsight Systems SQLite export), `decode_trace`;
- summaries: `nsys stats` and Nsight Compute CSV analyses, `decode_nsys_stats`, `decode_ncu`;
- pyspy: py-spy profile analyses, `decode_pyspy`;
- monitoring: nvidia-smi / dstat log analyses, `decode_monitoring`.

Pure: no Django.
"""
