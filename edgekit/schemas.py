"""JSON schemas for the files edgekit reads back: the model.json sidecar and the run manifest.
Anything read from disk is validated before use; a mismatch is one line naming the field."""
from edgekit.errors import EdgekitError

TENSOR = {"type": "object", "required": ["name", "dtype", "shape"],
          "properties": {"name": {"type": "string", "minLength": 1},
                         "dtype": {"enum": ["int32", "int64", "float32", "float16", "int8", "uint8"]},
                         "shape": {"type": "array", "items": {"type": ["string", "integer"]}}}}

MODEL_JSON = {
    "type": "object",
    "required": ["format", "inputs", "outputs", "labels", "max_length", "tokenizer", "pad_id"],
    "properties": {
        "format": {"enum": ["onnx", "tflite", "torchscript"]},
        "target": {"type": "string"},
        "inputs": {"type": "array", "items": TENSOR, "minItems": 1},
        "outputs": {"type": "array", "items": TENSOR, "minItems": 1},
        "labels": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "max_length": {"type": "integer", "minimum": 2, "maximum": 8192},
        "tokenizer": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+$"},  # a file beside the model, no paths
        "pad_id": {"type": "integer", "minimum": 0},
        "quantization": {"type": ["object", "null"]},
        "text_pair": {"type": "boolean"},  # each input is a text pair (text, text_pair)
        "multi_label": {"type": "boolean"},  # a sigmoid per label: each label whose logit is over 0 applies
        "thresholds": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
        # a multi-label model's probability cut per label (tuned on the validation split): over it, the label applies
    },
}

STAGE = {"type": "object", "required": ["name", "key", "input", "output", "seconds", "metrics", "files"],
         "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                        "seconds": {"type": "number"}, "metrics": {"type": "object"},
                        "files": {"type": "object", "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
                        "output": {"type": "object", "required": ["path", "kind"]}}}

MANIFEST = {
    "type": "object",
    "required": ["schema", "edgekit_version", "status", "recipe", "stages", "final", "budgets"],
    "properties": {
        "schema": {"const": 1},
        "status": {"enum": ["running", "complete", "over_budget"]},
        "stages": {"type": "array", "items": STAGE},
        "unchecked_stages": {"type": "array", "items": STAGE},
        "budgets": {"type": "array", "items": {"type": "object", "required": ["metric", "op", "target", "actual", "ok"]}},
        "devices": {"type": "object", "additionalProperties": {  # edgekit bench: one entry per target
            "type": "object", "required": ["kind", "complete"],
            "properties": {"complete": {"type": "boolean"}, "metrics": {"type": "object"},
                           "budgets": {"type": "array"}}}},
    },
}


def validate(obj, schema: dict, what: str) -> None:
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(obj))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "top level"
        raise EdgekitError(f"{what} is invalid at {where}: {error.message[:200]}")
