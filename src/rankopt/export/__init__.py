"""Models exported for other runtimes: ONNX (``rankopt export CHECKPOINT --format onnx --out MODEL.onnx``).

    from rankopt.export import export_checkpoint, OnnxNet
    exported = export_checkpoint("run/checkpoints/best.ckpt", "model.onnx")   # checked against PyTorch
    Embedder.from_onnx("model.onnx")            # rankopt.search: same fingerprint as the checkpoint's

:mod:`rankopt.export.onnx` writes the model (dynamic batch axis; preprocessing, input convention and
fingerprint in its metadata), :mod:`rankopt.export.onnx_net` runs it with onnxruntime, :mod:`rankopt.export.parity`
compares its embeddings with PyTorch's. onnx, onnxscript and onnxruntime are the optional ``onnx`` extra,
imported lazily (``pip install 'rankopt[onnx]'``).
"""

from rankopt.export.onnx import Exported, describe_input, export_checkpoint, export_onnx
from rankopt.export.parity import ParityReport, compare, row_cosines
from rankopt.export.onnx_net import OnnxMetadata, OnnxNet

__all__ = ["Exported", "OnnxMetadata", "OnnxNet", "ParityReport", "compare", "describe_input", "export_checkpoint",
           "export_onnx", "row_cosines"]
