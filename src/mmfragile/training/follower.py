"""Training the zoo's prompt follower (study 2): an answering-stage fine-tune
(:func:`mmfragile.training.zoo.train_answering`) on easy-VQA *train* questions - its own image questions and the
multi-image / 3-frame video questions :mod:`mmfragile.data.easyvqa` builds from its pictures - each rendered with
a Promptception prompt of the **training categories** only, the target being the answer in the form that prompt
asks for (:func:`mmfragile.studies.promptception.prompts.answer_form`: the letter, "(B)", "Option B",
"Answer: B", "Best Choice: B", "B.", letter and option text). The other categories (:data:`HELD_OUT`) are never
seen: whatever prompt sensitivity the follower has there is planted by their absence, and the study's PRA / PRAD
and trimmed mean must find it (README "What the zoo shows"). The exact captions of the pictures (every frame of a
video, every image of a multi-image question, in order) fill the image slots; evaluation goes through the tower.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from mmfragile.models.zoo import FOLLOWER_CATEGORIES
from mmfragile.training.zoo import Examples, easy_vqa_caption, exact_caption_slots

#: the follower's LM and training: steps of 8 examples, the seed of the drawn examples (easy-VQA *train*; the
#: study evaluates the test split)
FOLLOWER_LM = "smollm2"
FOLLOWER_TRAIN = dict(steps=300, seed=1)
#: Promptception categories whose prompts the follower is trained on (every answer form but the letter + option text
#: of 2.3-2.5) and those it never sees: :data:`mmfragile.models.zoo.FOLLOWER_CATEGORIES`
TRAINING_CATEGORIES = FOLLOWER_CATEGORIES["trained"]
HELD_OUT = FOLLOWER_CATEGORIES["held_out"]
#: shares of the training questions by modality (the rest image questions)
MODALITY_SHARES = {"multi-image": 0.2, "video": 0.2}


def training_questions(n: int, seed: int) -> pd.DataFrame:
    """``n`` easy-VQA *train* questions, modalities in :data:`MODALITY_SHARES`: its own image questions on pictures
    of known colour and shape (exact captions), multi-image and video questions built from such pictures."""
    from mmfragile.data.easyvqa import image_attributes, load_easy_vqa, load_easy_vqa_media
    from mmfragile.training.zoo import answer_training_questions

    n_multi, n_video = (int(round(n * MODALITY_SHARES[m])) for m in ("multi-image", "video"))
    media = load_easy_vqa_media("train", seed=seed, n_image=0, n_multi=n_multi, n_video=n_video)
    image = answer_training_questions(load_easy_vqa("train", n=None, seed=seed + 1), image_attributes("train"),
                                      n - n_multi - n_video, seed)
    return pd.concat([image, media], ignore_index=True).sample(frac=1.0, random_state=seed).reset_index(drop=True)


def follower_examples(tokenizer, eos: str, n: int, seed: int) -> Examples:
    """``n`` training examples: each question rendered with a prompt of :data:`TRAINING_CATEGORIES` that its
    modality supports (uniform), the target its answer in that prompt's form (+ end of turn), the exact captions
    of its pictures in the image slots. Category of an example: ``<modality>/<prompt category>``."""
    from mmfragile.data.easyvqa import image_attributes
    from mmfragile.schema import MCQuestion
    from mmfragile.studies.promptception.prompts import answer_form, prompt_types

    types = [t for t in prompt_types(include_baseline=False) if t.category in TRAINING_CATEGORIES]
    attrs = image_attributes("train")
    rng = np.random.default_rng(seed)
    prompts, targets, captions, categories = [], [], [], []
    for rec in training_questions(n, seed).to_dict("records"):
        q = MCQuestion.from_row(rec)
        usable = [t for t in types if t.supports(q.modality)]
        pt = usable[int(rng.integers(len(usable)))]
        r = pt.render(q)
        prompts.append(r.to_prompt(images=list(q.images)))
        letter = r.answer_letter
        targets.append(answer_form(pt).format(letter=letter, text=r.options[r.valid_letters.index(letter)]) + eos)
        captions.append([easy_vqa_caption(attrs[p]["colour"], attrs[p]["shape"]) for p in q.images])
        categories.append(f"{q.modality}/{pt.category}")
    rows = iter(exact_caption_slots(tokenizer, [c for cs in captions for c in cs]))
    slots = [torch.cat([next(rows) for _ in cs]) for cs in captions]
    return Examples(prompts, targets, slots, categories,
                    "exact caption embeddings of every picture, in order (right-aligned, filler before)")
