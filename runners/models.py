"""Models and deterministic synthetic data for the runner.

``build(name, ...)`` returns a ``ModelSpec``: the module, a loss function and a batch generator. torchvision ResNets
with random init; BERT-base written here with torch.nn (no ``transformers``): 12 layers, hidden 768, 12 heads,
FFN 3072, vocab 30522, learned positions, post-LayerNorm, masked-LM head tied to the word embeddings.
``mlp`` and ``cnn`` are small models with a *learnable* synthetic task (labels from a fixed random teacher), for
tests; the ResNets and BERT get random labels (the runner measures speed, not accuracy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from runners.catalog import MODEL_NAMES as MODELS  # the torch-free catalogue names them

# ----------------------------------------------------------------------------------------------------------------
# BERT-base


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    ffn: int = 3072
    max_positions: int = 512
    type_vocab: int = 2
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.attn_out = nn.Linear(cfg.hidden, cfg.hidden)
        self.attn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(cfg.hidden, cfg.ffn)
        self.ffn_out = nn.Linear(cfg.ffn, cfg.hidden)
        self.ffn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout.p if self.training else 0.0)
        a = a.transpose(1, 2).reshape(b, s, h)
        x = self.attn_norm(x + self.dropout(self.attn_out(a)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))


class BertForMaskedLM(nn.Module):
    """BERT-base encoder + masked-LM head (decoder weight tied to the word embeddings)."""

    def __init__(self, cfg: BertConfig = BertConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.emb_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.layers))
        self.head_dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.head_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.head_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        pos = torch.arange(s, device=tokens.device)
        x = self.word(tokens) + self.position(pos)[None] + self.token_type(torch.zeros_like(tokens))
        x = self.dropout(self.emb_norm(x))
        for layer in self.layers:
            x = layer(x)
        x = self.head_norm(F.gelu(self.head_dense(x)))
        return F.linear(x, self.word.weight, self.head_bias)  # (b, s, vocab)


# ----------------------------------------------------------------------------------------------------------------
# Small models for tests


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, hidden: int = 64, classes: int = 10, depth: int = 5) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(d_in, hidden), nn.ReLU()]
        for _ in range(depth - 2):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        layers.append(nn.Linear(hidden, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )  # fmt: skip
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


# ----------------------------------------------------------------------------------------------------------------


@dataclass
class ModelSpec:
    name: str
    module: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # step -> (inputs, targets)
    image_size: int | None
    seq_len: int | None


def build(
    name: str,
    batch_size: int,
    *,
    seed: int = 0,
    rank: int = 0,
    image_size: int = 64,
    seq_len: int = 128,
    device: torch.device | str = "cpu",
    distinct_batches: int = 4,
    in_channels: int = 3,
    num_classes: int | None = None,
) -> ModelSpec:
    """Model with deterministic random init (``seed``, same on every rank) and ``distinct_batches`` synthetic
    batches per rank (from ``seed`` and ``rank``), cycled by step. ``in_channels`` and ``num_classes`` follow a real
    data set (runners/data.py; ResNets and the CNN); the defaults are the synthetic task's."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    if batch_size < 1:
        raise ValueError(f"batch size {batch_size} is not accepted: expected >= 1")
    device = torch.device(device)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed * 1000 + 17)  # task (teacher): same on every rank
    data_gen = torch.Generator().manual_seed(seed * 1000 + 1 + rank * 7919)  # data: per rank
    ce = nn.CrossEntropyLoss()
    img = None
    seq = None
    if name.startswith("resnet"):
        import torchvision

        classes = num_classes or 1000
        module = getattr(torchvision.models, name)(weights=None, num_classes=classes)
        if in_channels != 3:
            module.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        img = image_size
        batches = [
            (
                torch.randn(batch_size, in_channels, img, img, generator=data_gen),
                torch.randint(0, classes, (batch_size,), generator=data_gen),
            )
            for _ in range(distinct_batches)
        ]
        loss_fn = ce
    elif name == "bert-base":
        module = BertForMaskedLM()
        seq = seq_len
        if not 1 <= seq <= module.cfg.max_positions:
            raise ValueError(f"seq_len {seq} is outside [1, {module.cfg.max_positions}]")
        vocab = module.cfg.vocab_size
        batches = [
            (
                torch.randint(0, vocab, (batch_size, seq), generator=data_gen),
                torch.randint(0, vocab, (batch_size, seq), generator=data_gen),
            )
            for _ in range(distinct_batches)
        ]

        def loss_fn(logits, target):
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    elif name == "mlp":
        module = MLP()
        teacher = torch.randn(32, 10, generator=gen)
        xs = [torch.randn(batch_size, 32, generator=data_gen) for _ in range(distinct_batches)]
        batches = [(x, (x @ teacher).argmax(dim=1)) for x in xs]
        loss_fn = ce
    else:  # cnn
        module = SmallCNN(num_classes or 10, in_channels)
        img = image_size
        teacher = torch.randn(in_channels, num_classes or 10, generator=gen)
        xs = [torch.randn(batch_size, in_channels, img, img, generator=data_gen) for _ in range(distinct_batches)]
        batches = [(x, (x.mean(dim=(2, 3)) @ teacher).argmax(dim=1)) for x in xs]
        loss_fn = ce
    module = module.to(device)
    batches = [(x.to(device), y.to(device)) for x, y in batches]

    def make_batch(step: int):
        return batches[step % len(batches)]

    return ModelSpec(name, module, loss_fn, make_batch, img, seq)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


__all__ = ["MODELS", "BertConfig", "BertForMaskedLM", "MLP", "SmallCNN", "ModelSpec", "build", "count_parameters"]


MOMENTUM = 0.9


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """The optimizer of every trial (SGD with momentum 0.9); the profile steps the same one, so its optimizer time is
    the trials' (plain SGD measured 5 ms where the trials' momentum SGD took 13 ms on ResNet-18)."""
    return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)
