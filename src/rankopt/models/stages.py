"""A retrieval network cut in two at a stage boundary: a fixed trunk and a trainable tail.

A backbone that can be cut offers ``stages() -> list[nn.Module]``, its forward as a sequence of modules
sharing its parameters (MobileNetV2 / EfficientNet-Lite0/2, MobileFaceNet, ResNet). With the trunk
``T = stages[:k]`` fixed, ``net(x) = tail(T(x))`` where ``tail = head ∘ pool ∘ stages[k:]``; the trunk's
outputs of a set of images can be computed once and the tail trained on them (``rankopt fit``), and the
weights of ``net`` stay those of one ordinary :class:`~rankopt.models.retrieval_net.RetrievalNet`.
"""

from __future__ import annotations

from torch import Tensor, nn

from rankopt.models.retrieval_net import RetrievalNet


def backbone_stages(net: RetrievalNet) -> list[nn.Module]:
    """The stages of ``net``'s backbone; a clear error for a backbone that has none."""
    stages = getattr(net.backbone, "stages", None)
    if stages is None:
        raise ValueError(f"backbone {type(net.backbone).__name__} cannot be cut into stages (supported: "
                         "mobilenet_v2, efficientnet_lite0/2, mobilefacenet, resnet18/34/50/101)")
    return list(stages())


class Tail(nn.Module):
    """``head(pool(stages(x)))``: the rest of a :class:`RetrievalNet` after its trunk."""

    def __init__(self, net: RetrievalNet, stages: list[nn.Module]) -> None:
        super().__init__()
        self.net = net
        self.stages = nn.Sequential(*stages)

    def forward(self, trunk_output: Tensor) -> Tensor:
        return self.net.head(self.net.pool(self.stages(trunk_output)))

    def train(self, mode: bool = True) -> Tail:
        """Train/eval mode as the network's own :meth:`RetrievalNet.train` sets it (frozen BatchNorm stays frozen)."""
        super().train(mode)
        self.net.train(mode)
        return self


def cut(net: RetrievalNet, at: int) -> tuple[nn.Sequential, Tail]:
    """``(trunk, tail)`` with ``tail(trunk(x)) == net(x)``: the trunk is the first ``at`` stages
    (``0 < at < len(stages)``); both share ``net``'s parameters."""
    stages = backbone_stages(net)
    if not 0 < at < len(stages):
        raise ValueError(f"cut at stage {at}: the backbone has {len(stages)} stages (cut within 1..{len(stages) - 1})")
    return nn.Sequential(*stages[:at]), Tail(net, stages[at:])
