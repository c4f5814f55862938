"""Rewrite a .tflite file smaller, with the same graph and the same weights byte for byte.

A bucketed model has one subgraph per sequence length. The converter shares weight buffers between them, but
each subgraph's tensors carry their own quantization parameters: a per-row INT8 table of 30,522 rows stores 30,522
scales and 30,522 int64 zero points three times over. `compact` writes every distinct set of parameters once (a
FlatBuffers table may be referenced from many places), drops the debug names of tensors that are neither a
subgraph's input nor its output (signatures keep theirs; only for final artifacts: ai-edge-quantizer finds
tensors by name, so FP32 exports keep them), and lays the weights out after the FlatBuffer on
64-byte boundaries, as the converter does. Measured on minilm-l6 INT8 (3 buckets): 25.96 -> 24.03 MB; outputs of
every signature identical (embedding table per-row; per-tensor, as edgekit quantizes it: 23.67 MB).
"""
from pathlib import Path

import numpy as np

from edgekit.artifact import through_temp
from edgekit.errors import EdgekitError

ALIGN = 64


def compact(path: Path) -> None:
    """Rewrite `path` in place (through a temporary file)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    raw = Path(path).read_bytes()
    model = schema.ModelT.InitFromPackedBuf(raw, 0)
    # weights the converter stored after the FlatBuffer (offset > 1); small ones stay inline in `data`
    blobs = [raw[b.offset:b.offset + b.size] if b.offset > 1 else None for b in model.buffers]
    shared = {}
    for graph in model.subgraphs:
        named = set(_ints(graph.inputs)) | set(_ints(graph.outputs))
        for i, tensor in enumerate(graph.tensors):
            if i not in named:
                tensor.name = None
            q = tensor.quantization
            if q is not None and q.scale is not None and len(q.scale) > 1:
                key = (q.quantizedDimension, np.asarray(q.scale, np.float32).tobytes(),
                       np.asarray(q.zeroPoint if q.zeroPoint is not None else [], np.int64).tobytes())  # optional
                tensor.quantization = shared.setdefault(key, q)
    packed, pack_quantization = {}, schema.QuantizationParametersT.Pack

    def pack_once(q, builder):  # one table for every tensor that shares these parameters
        if id(q) not in packed:
            packed[id(q)] = pack_quantization(q, builder)
        return packed[id(q)]

    def pack_buffer(buffer, builder):  # inline data 16-byte aligned, as the schema asks (force_align: 16)
        data = None
        if buffer.data is not None and len(buffer.data):
            payload = np.asarray(buffer.data, np.uint8).tobytes()
            builder.StartVector(1, len(payload), 16)
            builder.head -= len(payload)
            builder.Bytes[builder.head:builder.head + len(payload)] = payload
            builder.vectorNumElems = len(payload)
            data = builder.EndVector()
        schema.BufferStart(builder)
        if data is not None:
            schema.BufferAddData(builder, data)
        schema.BufferAddOffset(builder, buffer.offset)
        schema.BufferAddSize(builder, buffer.size)
        return schema.BufferEnd(builder)

    # Offsets of the weights depend on the FlatBuffer's length; the placeholder offset is as wide as the real one
    # (uint64 fields), so a second pass with the real offsets has the same length. Checked, not assumed.
    start, head, layout = 1 << 40, b"", []
    pack_data = schema.BufferT.Pack
    schema.QuantizationParametersT.Pack, schema.BufferT.Pack = pack_once, pack_buffer
    try:
        for _ in range(3):
            position, layout = start, []
            for buffer, blob in zip(model.buffers, blobs):
                if blob is not None:
                    buffer.offset, buffer.size = position, len(blob)
                    layout.append((position, blob))
                    position += -(-len(blob) // ALIGN) * ALIGN
            packed.clear()
            builder = flatbuffers.Builder(1 << 20)
            builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
            head = bytes(builder.Output())
            end = -(-len(head) // ALIGN) * ALIGN
            if end == start:
                break
            start = end
        else:
            raise EdgekitError(f"could not compact {path}: its FlatBuffer length did not settle in 3 passes; "
                               f"please report it with the model")
    finally:
        schema.QuantizationParametersT.Pack, schema.BufferT.Pack = pack_quantization, pack_data
    with through_temp(path, Path(str(path) + ".compact.tmp")) as tmp, open(tmp, "wb") as f:
        f.write(head)
        for position, blob in layout:
            f.write(b"\0" * (position - f.tell()))
            f.write(blob)


def _ints(values) -> list:
    return [] if values is None else [int(v) for v in values]
