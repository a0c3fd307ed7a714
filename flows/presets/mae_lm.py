"""MAE-LM (Meng et al., 2024): the masked LM against an encoder that never sees [MASK], by its decoder's
depth."""

from __future__ import annotations

from flows.presets import MODELS_KEY, Card, Row, Setup, made_from


def mae_lm(layers: int) -> dict:
    return {
        **made_from("encoder_mlm", "encoder_mae_lm", objective="mae_lm"),
        "objectives.mae_lm.decoder_layers": layers,
    }


CARDS = (
    Card(
        preset="mae_lm",
        paper="MAE-LM (Meng et al., 2024)",
        table="Table 2 (ablations of MAE-LM-base)",
        compares="BERT's masked LM (the encoder reads [MASK]) against MAE-LM, whose encoder reads only the "
        "unmasked tokens and whose decoder of 2, 4 or 6 layers predicts the masked ones",
        metric="GLUE dev average",
        figures_from="the seeds' MAE-LM notes, which reproduce the paper's Table 2 with its caption: MLM "
        "85.2; decoders of 2, 4 and 6 layers 85.8, 86.1, 84.8 (not checked against the paper's own text)",
        compute="equal steps",
        rows=(
            Row("enc. w. [MASK] (MLM)", {MODELS_KEY: "encoder_mlm"}, 85.2),
            Row("2-layer decoder", mae_lm(2), 85.8),
            Row("MAE-LM-base (4-layer decoder)", mae_lm(4), 86.1, star=True),
            Row("6-layer decoder", mae_lm(6), 84.8),
        ),
        setup=Setup(
            model="BERT-Base's encoder, 12 × 768, and a decoder of the encoder's width",
            data="Wikipedia and BookCorpus, 16 GB (as recalled; not checked for this card)",
            steps="its base setting's budget (not checked for this card)",
            tokenizer="BPE (not checked for this card)",
            evaluation="GLUE dev average",
        ),
        differences=(
            "its other rows (the decoder's attention, [MASK] handling, positions) are left out",
            "the same steps each, as the paper's ablations",
        ),
    ),
)
