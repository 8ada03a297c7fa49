"""iMixer configuration.

Ota, Taki, *iMixer: hierarchical Hopfield network implies an invertible, implicit and iterative
MLP-Mixer*. An MLP-Mixer whose token-mixing MLP inverts a spectrally normalised residual block
x = (1 − F)⁻¹(fc1(t)) with `fixed_point_iterations` fixed-point steps (0 = the vanilla MLP-Mixer).
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig

# MLP-Mixer S/B/L (Tolstikhin et al., Table 1: width, depth) at patch 16 and 32, with the iMixer
# paper's best setting h_r = 2, n = 2 (Ota & Taki, CIFAR-10 at 224², 10 classes). Parameter counts
# they must reproduce are asserted in tests/test_modeling_imixer.py.
_MIXER_SIZES = {"s": (512, 8), "b": (768, 12), "l": (1024, 24)}
IMIXER_PRESETS: dict[str, dict[str, Any]] = {
    f"{size}{patch}": dict(
        hidden_size=width,
        num_hidden_layers=depth,
        patch_size=patch,
        image_size=224,
        hidden_ratio=2.0,
        fixed_point_iterations=2,
        num_labels=10,
    )
    for size, (width, depth) in _MIXER_SIZES.items()
    for patch in (16, 32)
}


def _pair(value: int | list[int] | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _require(condition: bool, name: str, value: Any, allowed: str) -> None:
    if not condition:
        raise ValueError(f"IMixerConfig: invalid {name}={value!r}; {allowed}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class IMixerConfig(PreTrainedConfig):
    r"""Configuration of an iMixer model (`model_type="imixer"`).

    Args:
        input_type (`str`, *optional*, defaults to `"image"`):
            `"image"` (patch embedding of `pixel_values`) or `"sequence"` (token embedding of `input_ids`).
        hidden_size (`int`, *optional*, defaults to 512):
            Channel width D (Mixer-S).
        num_hidden_layers (`int`, *optional*, defaults to 8):
            Number of Mixer blocks (Mixer-S).
        patch_size (`int`, *optional*, defaults to 16):
            Side of the square, non-overlapping patches (Mixer-S/16).
        image_size (`int` or `list[int]`, *optional*, defaults to 224):
            Input resolution (height, width); it fixes the token-mixing length S = (H/p)(W/p).
        num_channels (`int`, *optional*, defaults to 3):
            Image channels.
        token_mixing_ratio (`float`, *optional*, defaults to 0.5):
            Token-mixing width D_S = int(ratio · D) (timm's Mixer `mlp_ratio[0]`).
        channel_mixing_ratio (`float`, *optional*, defaults to 4.0):
            Channel-mixing width D_C = int(ratio · D) (timm's Mixer `mlp_ratio[1]`).
        hidden_ratio (`float`, *optional*, defaults to 2.0):
            h_r: width N_h = int(h_r · D_S) of the contractive block F (paper's best setting: 2).
        fixed_point_iterations (`int`, *optional*, defaults to 2):
            n: fixed-point steps x ← x₀ + F(x) that approximate (1 − F)⁻¹ (paper's best: 2); 0 builds
            no contractive block and is exactly the vanilla MLP-Mixer.
        spectral_norm_coeff (`float`, *optional*, defaults to 0.9):
            c: soft spectral normalisation caps σ(W) of F's two weights at c (0.9, specs/imixer.md).
        spectral_norm_power_iterations (`int`, *optional*, defaults to 8):
            k: power-iteration steps per training forward that refine the σ estimate (8, specs/imixer.md).
        hidden_dropout_prob (`float`, *optional*, defaults to 0.0):
            Dropout after each MLP's activation and output (timm's Mixer `proj_drop_rate`; 0 = off).
        drop_path_rate (`float`, *optional*, defaults to 0.0):
            Stochastic-depth rate, the same for every block as in timm's Mixer (0 = off).
        vocab_size (`int`, *optional*):
            Token vocabulary for `input_type="sequence"` (required there).
        max_position_embeddings (`int`, *optional*, defaults to 128):
            Token-mixing length S for sequences: every input is padded internally to S, so longer ones
            are rejected; 128 covers sentence-level tasks without paying for 512 padded tokens.
        layer_norm_eps (`float`, *optional*, defaults to 1e-6):
            LayerNorm epsilon (timm's Mixer).
        initializer_range (`float`, *optional*, defaults to 0.02):
            Std of the normal initialisation of token and pad embeddings (Linear layers use timm's
            Xavier-uniform, the patch convolution LeCun-normal, the classifier zeros).
    """

    model_type = "imixer"

    def __init__(
        self,
        input_type: str = "image",
        hidden_size: int = 512,
        num_hidden_layers: int = 8,
        patch_size: int = 16,
        image_size: int | list[int] = 224,
        num_channels: int = 3,
        token_mixing_ratio: float = 0.5,
        channel_mixing_ratio: float = 4.0,
        hidden_ratio: float = 2.0,
        fixed_point_iterations: int = 2,
        spectral_norm_coeff: float = 0.9,
        spectral_norm_power_iterations: int = 8,
        hidden_dropout_prob: float = 0.0,
        drop_path_rate: float = 0.0,
        vocab_size: int | None = None,
        max_position_embeddings: int = 128,
        layer_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        **kwargs: Any,
    ) -> None:
        _require(
            input_type in ("image", "sequence"), "input_type", input_type, "expected 'image' or 'sequence'"
        )
        for name, value in (
            ("hidden_size", hidden_size),
            ("num_hidden_layers", num_hidden_layers),
            ("patch_size", patch_size),
            ("num_channels", num_channels),
            ("max_position_embeddings", max_position_embeddings),
            ("spectral_norm_power_iterations", spectral_norm_power_iterations),
        ):
            _require(_is_int(value) and value >= 1, name, value, "expected an integer >= 1")
        _require(
            _is_int(fixed_point_iterations) and fixed_point_iterations >= 0,
            "fixed_point_iterations",
            fixed_point_iterations,
            "expected an integer >= 0 (0 = vanilla MLP-Mixer token mixing)",
        )
        for name, value, base in (
            ("token_mixing_ratio", token_mixing_ratio, hidden_size),
            ("channel_mixing_ratio", channel_mixing_ratio, hidden_size),
            (
                "hidden_ratio",
                hidden_ratio,
                int(token_mixing_ratio * hidden_size) if _is_number(token_mixing_ratio) else 0,
            ),
        ):
            _require(
                _is_number(value) and value > 0 and int(value * base) >= 1,
                name,
                value,
                f"expected a number > 0 that gives a width int({name} · {base}) >= 1",
            )
        _require(
            _is_number(spectral_norm_coeff) and 0 < spectral_norm_coeff < 1,
            "spectral_norm_coeff",
            spectral_norm_coeff,
            "expected 0 < c < 1 (the fixed-point solve needs a contractive F)",
        )
        for name, value in (("hidden_dropout_prob", hidden_dropout_prob), ("drop_path_rate", drop_path_rate)):
            _require(_is_number(value) and 0 <= value < 1, name, value, "expected a probability in [0, 1)")
        sides = (image_size, image_size) if _is_int(image_size) else image_size
        _require(
            isinstance(sides, (list, tuple))
            and len(sides) == 2
            and all(_is_int(side) and side >= 1 for side in sides),
            "image_size",
            image_size,
            "expected an integer >= 1 or a [height, width] pair of them",
        )
        height, width = _pair(image_size)
        _require(
            height % patch_size == 0 and width % patch_size == 0,
            "image_size",
            image_size,
            f"both sides must be divisible by patch_size={patch_size}",
        )
        if input_type == "sequence":
            _require(
                _is_int(vocab_size) and vocab_size >= 1,
                "vocab_size",
                vocab_size,
                'input_type="sequence" needs an integer vocab_size >= 1',
            )
        _require(
            _is_number(layer_norm_eps) and layer_norm_eps > 0,
            "layer_norm_eps",
            layer_norm_eps,
            "expected a float > 0",
        )
        _require(
            _is_number(initializer_range) and initializer_range > 0,
            "initializer_range",
            initializer_range,
            "expected a float > 0",
        )

        self.input_type = input_type
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.patch_size = patch_size
        self.image_size = image_size if isinstance(image_size, int) else [height, width]
        self.num_channels = num_channels
        self.token_mixing_ratio = token_mixing_ratio
        self.channel_mixing_ratio = channel_mixing_ratio
        self.hidden_ratio = hidden_ratio
        self.fixed_point_iterations = fixed_point_iterations
        self.spectral_norm_coeff = spectral_norm_coeff
        self.spectral_norm_power_iterations = spectral_norm_power_iterations
        self.hidden_dropout_prob = hidden_dropout_prob
        self.drop_path_rate = drop_path_rate
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        super().__init__(**kwargs)

    @property
    def num_tokens(self) -> int:
        """Token-mixing length S: patches per image, or `max_position_embeddings` for sequences."""
        if self.input_type == "sequence":
            return self.max_position_embeddings
        height, width = _pair(self.image_size)
        return (height // self.patch_size) * (width // self.patch_size)

    @property
    def token_mixing_size(self) -> int:
        """D_S = int(token_mixing_ratio · D)."""
        return int(self.token_mixing_ratio * self.hidden_size)

    @property
    def channel_mixing_size(self) -> int:
        """D_C = int(channel_mixing_ratio · D)."""
        return int(self.channel_mixing_ratio * self.hidden_size)

    @property
    def contractive_size(self) -> int:
        """N_h = int(hidden_ratio · D_S), the width of the contractive block F."""
        return int(self.hidden_ratio * self.token_mixing_size)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> IMixerConfig:
        """Config of a named paper setting (`IMIXER_PRESETS`: s16, b16, l16, s32, b32, l32), overrides on top."""
        if name not in IMIXER_PRESETS:
            raise ValueError(
                f"IMixerConfig: unknown preset name={name!r}; expected one of {sorted(IMIXER_PRESETS)}."
            )
        kwargs = {**IMIXER_PRESETS[name], **overrides}
        if "id2label" in overrides:
            kwargs.pop("num_labels", None)
        return cls(**kwargs)


__all__ = ["IMIXER_PRESETS", "IMixerConfig"]
