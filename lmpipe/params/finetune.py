"""The fine-tuning sections: `glue` (where the tasks come from) and `finetune` (their recipes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from lmpipe.glue.tasks import TASKS
from lmpipe.params.glue import GlueParams
from lmpipe.params.models import ModelsSections
from lmpipe.params.schema import Fraction, Seed, Strict, _problems
from models.specs.architectures import ARCHITECTURES


class FinetuneTaskParams(Strict):
    """The fine-tuning recipe of one GLUE task."""

    lr: float = Field(1e-4, gt=0)
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    max_len: int = Field(128, ge=4, description="[CLS] a [SEP] b [SEP], longest side cut first")
    warmup_ratio: Fraction = 0.1
    max_train_rows: int | None = Field(None, ge=1, description="a seeded sample of the train split")
    max_eval_rows: int | None = Field(None, ge=1, description="the first rows of each evaluation split")


class FinetuneCommonParams(Strict):
    """What every fine-tune shares."""

    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="before the head")
    pooling: dict[str, str] = Field(
        default_factory=lambda: {name: arch.poolings[0] for name, arch in ARCHITECTURES.items()},
        description="the head's input, by architecture (models/specs/architectures: each lists its poolings, "
        "the first its default)",
    )
    lm_loss_weight: float = Field(
        0.0,
        ge=0,
        description="GPT-1's auxiliary objective: the LM loss of the fine-tuning input beside the task's, "
        "at this weight (GPT-1: 0.5); for the architectures whose fine-tuning reads the input as a causal "
        "LM (decoder)",
    )
    eval_batch_size: int = Field(128, ge=1)
    group_by_length: bool = Field(True, description="batches of similar lengths (less padding)")
    precision: Literal["auto", "32-true", "bf16-mixed"] = Field(
        "32-true", description="auto: bf16-mixed where bf16 is native (a GPU, AVX512-BF16, AMX), else 32-true"
    )
    accelerator: Literal["cpu", "gpu", "auto"] = "cpu"
    threads: int = Field(
        1,
        ge=0,
        description="CPU threads of each fine-tune (0 = all cores); the stage runs as many fine-tunes at "
        "once as its cores hold. The thread count changes the float bits, so it is a param",
    )

    @field_validator("pooling")
    @classmethod
    def _poolings_fit(cls, pooling: dict[str, str]) -> dict[str, str]:
        for arch, chosen in pooling.items():
            if arch not in ARCHITECTURES:
                raise ValueError(f"'{arch}' is not an architecture (one of: {', '.join(ARCHITECTURES)})")
            if chosen not in ARCHITECTURES[arch].poolings:
                allowed = " or ".join(ARCHITECTURES[arch].poolings)
                raise ValueError(f"pooling '{chosen}' does not fit arch '{arch}' (use {allowed})")
        return pooling

    def pooling_of(self, arch: str) -> str:
        """The pooling of an architecture's fine-tunes: set here, else its default."""
        return self.pooling.get(arch, ARCHITECTURES[arch].poolings[0])


class MethodParams(Strict):
    """What every fine-tuning method but `full` may set."""

    lr: float | None = Field(
        None, gt=0, description="this method's lr for every task, in place of the task's (None: the task's)"
    )


class LoraParams(MethodParams):
    rank: int = Field(8, ge=1, description="r: the rank of B A")
    alpha: float = Field(16.0, gt=0, description="α: the update is scaled by α / r")
    dropout: Fraction = Field(0.1, description="on LoRA's input")
    targets: list[Literal["attention", "attention_out", "mlp"]] = Field(
        ["attention"],
        min_length=1,
        description="the linear layers adapted: attention (the fused q, k, v projection), attention_out, "
        "mlp (both layers)",
    )


class AdapterParams(MethodParams):
    bottleneck: int = Field(64, ge=1, description="the adapter's inner width")


class AdamixParams(AdapterParams):
    bottleneck: int = Field(16, ge=1, description="each expert's inner width")
    experts: int = Field(4, ge=1, description="the down (and up) projections each adapter mixes")
    share_up: bool = Field(True, description="one up projection for all experts (AdaMix's sharing_up)")


class PrefixParams(MethodParams):
    length: int = Field(16, ge=1, description="the keys and values before every self-attention's")
    hidden: int = Field(512, ge=1, description="the width of the MLP that makes them (Li & Liang's)")


class PromptParams(MethodParams):
    length: int = Field(20, ge=1, description="the vectors before the input (they count towards max_len)")


class FinetuneMethods(Strict):
    """Each method's own params; `finetune.method` says which one applies."""

    frozen: MethodParams = MethodParams()
    lora: LoraParams = LoraParams()
    houlsby: AdapterParams = AdapterParams()
    pfeiffer: AdapterParams = AdapterParams()
    adamix: AdamixParams = AdamixParams()
    prefix: PrefixParams = PrefixParams()
    prompt: PromptParams = PromptParams()


Method = Literal["full", "frozen", "lora", "houlsby", "pfeiffer", "adamix", "prefix", "prompt"]


class FinetuneParams(Strict):
    """Every pretrained model (and a from-scratch copy of it) fine-tuned on every task of `glue.tasks`,
    once per seed; reports give the median over seeds."""

    seeds: list[Seed] = Field([1, 2, 3], min_length=1)
    method: Method = Field(
        "full",
        description="what trains: full (every weight), frozen (the head on fixed features, ELMo's), lora, "
        "houlsby, pfeiffer, adamix, prefix or prompt (the backbone frozen, the method's weights and the "
        "head trained; models/finetune_methods.py)",
    )
    methods: FinetuneMethods = FinetuneMethods()
    common: FinetuneCommonParams = FinetuneCommonParams()
    tasks: dict[str, FinetuneTaskParams] = {}
    # here, not under `models.<name>`, so that a fine-tuning change leaves `pretrain@<name>` (which
    # depends on the whole `models.<name>`) cached; checked against the task keys by FinetuneSections
    models: dict[str, dict[str, Any]] = Field(
        {}, description="a model's own values of `finetune.tasks` keys, for every task (e.g. its lr)"
    )

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        return seeds

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: dict[str, FinetuneTaskParams]) -> dict[str, FinetuneTaskParams]:
        for name in tasks:
            if name not in TASKS:
                raise ValueError(f"'{name}' is not a GLUE task; the tasks are: {', '.join(TASKS)}")
        return tasks


class FinetuneSections(ModelsSections):
    """The sections the fine-tunes and `evaluate` read, and what they must agree on."""

    glue: GlueParams = GlueParams(path="data/sample/glue", synthetic=True)
    finetune: FinetuneParams = FinetuneParams()

    def method_params(self) -> MethodParams | None:
        """The params of `finetune.method` (None: full fine-tuning has none)."""
        method = self.finetune.method
        return None if method == "full" else getattr(self.finetune.methods, method)

    def recipe_of(self, model: str, task: str) -> FinetuneTaskParams:
        """The recipe of `task` as it applies to `model`: its `finetune.models.<model>` values on top, and
        the method's lr on top of that."""
        own = dict(self.finetune.models.get(model, {}))
        method = self.method_params()
        if method is not None and method.lr is not None:
            own["lr"] = method.lr
        return FinetuneTaskParams.model_validate({**self.finetune.tasks[task].model_dump(), **own})

    def recipe_key(self, model: str, task: str, key: str) -> str:
        """The dotted key that sets `key` of `task` for `model`: the method's lr, its own
        `finetune.models.<model>` or the task's."""
        method = self.method_params()
        if key == "lr" and method is not None and method.lr is not None:
            return f"finetune.methods.{self.finetune.method}.lr"
        own = self.finetune.models.get(model, {})
        return f"finetune.models.{model}.{key}" if key in own else f"finetune.tasks.{task}.{key}"

    @model_validator(mode="after")
    def _model_recipes(self) -> FinetuneSections:
        for model, own in self.finetune.models.items():
            if model not in self.models:
                known = ", ".join(self.models) or "(none)"
                raise ValueError(f"finetune.models.{model}: no such model; the models are: {known}")
            try:
                FinetuneTaskParams.model_validate({**FinetuneTaskParams().model_dump(), **own})
            except ValidationError as exc:
                raise ValueError(_problems(exc, f"finetune.models.{model}")) from None
        return self

    @model_validator(mode="after")
    def _lm_loss_fits(self) -> FinetuneSections:
        weight = self.finetune.common.lm_loss_weight
        for model, variant in self.models.items():
            if weight and not ARCHITECTURES[variant.arch].finetune_lm_loss:
                fits = " or ".join(name for name, arch in ARCHITECTURES.items() if arch.finetune_lm_loss)
                raise ValueError(
                    f"finetune.common.lm_loss_weight ({weight}): models.{model} (arch '{variant.arch}') "
                    f"has no causal LM over its fine-tuning input; the auxiliary LM loss fits arch {fits}"
                )
        return self

    @model_validator(mode="after")
    def _method_fits(self) -> FinetuneSections:
        method = self.finetune.method
        if method in ("full", "frozen"):
            return self
        for model, variant in self.models.items():
            arch, config = ARCHITECTURES[variant.arch], variant.config()
            fits = " or ".join(name for name, spec in ARCHITECTURES.items() if spec.transformer_blocks)
            if not arch.transformer_blocks:
                problem = f"arch '{variant.arch}' has no transformer blocks to add to (it fits arch {fits})"
            elif method != "prompt" and config.share_layers != "none":
                problem = f"its blocks share weights (share_layers: {config.share_layers}); use prompt"
            elif method == "prefix" and config.positions == "xl":
                problem = "Transformer-XL's relative attention takes no prefix (positions: xl)"
            else:
                continue
            raise ValueError(f"finetune.method ({method}): models.{model}: {problem}")
        return self

    @model_validator(mode="after")
    def _tasks_have_recipes(self) -> FinetuneSections:
        for i, name in enumerate(self.glue.tasks):
            if name not in self.finetune.tasks:
                raise ValueError(f"finetune.tasks.{name}: required, glue.tasks[{i}] is '{name}'")
            for model, variant in self.models.items():
                max_len, recipe = variant.config_fields()["max_len"], self.recipe_of(model, name)
                prompt = self.finetune.methods.prompt.length if self.finetune.method == "prompt" else 0
                if recipe.max_len + prompt > max_len:
                    plus = f" + finetune.methods.prompt.length ({prompt})" if prompt else ""
                    raise ValueError(
                        f"{self.recipe_key(model, name, 'max_len')} ({recipe.max_len}){plus} is longer "
                        f"than models.{model}.max_len ({max_len})"
                    )
        return self
