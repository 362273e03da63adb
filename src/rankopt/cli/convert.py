"""``rankopt convert BACKBONE WEIGHTS --out MODEL.ckpt [--transform PRESET] [--image-size H[xW]] [--embedding-dim D]``."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert", help="turn released weights (ImageNet, face models) into a rankopt checkpoint",
        description="Load a backbone's released weights file in its own key layout and write a rankopt model "
                    "checkpoint (safetensors, weights-only) whose test transform is the release's input convention. "
                    "evaluate / embed / index / search / whiten then use it as is, and `rankopt train RECIPE "
                    "model.init=MODEL.ckpt` fine-tunes it (weights and architecture in, fresh optimizer, new run).")
    parser.add_argument("backbone", help="a built-in backbone (rankopt.models.BACKBONES), e.g. mobilenet_v2, "
                                         "efficientnet_lite0, efficientnet_lite2, mobilefacenet, resnet50, iresnet50")
    parser.add_argument("weights", help="the released weights file (safetensors or a weights-only torch file)")
    parser.add_argument("--out", required=True, metavar="MODEL.ckpt", help="the checkpoint to write")
    parser.add_argument("--transform", metavar="PRESET",
                        help="test transform preset (default: the release's, e.g. mobilefacenet_test, test)")
    parser.add_argument("--image-size", metavar="H[xW]",
                        help="test image size (default: the release's, e.g. 260 for efficientnet_lite2, else the "
                             "preset's)")
    parser.add_argument("--embedding-dim", type=int, metavar="D",
                        help="add an (untrained) linear projection to D dimensions (default: none)")
    parser.add_argument("--pooling", choices=("avg", "max", "gem"), default="avg", help="default: avg")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankopt.engine.assembly import inference_preprocessing
    from rankopt.engine.convert import convert_released_weights, write_converted
    from rankopt.models.fingerprint import model_fingerprint

    converted = convert_released_weights(args.backbone, args.weights, transform=args.transform,
                                         image_size=args.image_size, embedding_dim=args.embedding_dim,
                                         pooling=args.pooling)
    path = write_converted(converted, args.out)
    cfg, model = converted.config, converted.model
    fingerprint = model_fingerprint(model, inference_preprocessing(cfg))
    size = cfg.data.image_size or "the preset's"
    print(f"wrote {path}: {args.backbone} from {converted.source['weights']} (sha256 "
          f"{converted.source['sha256'][:12]}), "
          f"{model.embedding_dim}-d embeddings, test transform {cfg.data.test_transform} at {size}, "
          f"fingerprint {fingerprint}")
    if args.embedding_dim is not None:
        print("note: the projection is randomly initialised; fine-tune it with "
              f"`rankopt train RECIPE model.init={path}` before relying on it")
    print(f"next: rankopt evaluate {path} --dataset NAME --root PATH   |   rankopt index {path} IMAGES --out INDEX")
    return 0
