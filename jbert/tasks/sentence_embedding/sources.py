"""The bi-encoders' datasets: the user's files (task.train_file / eval_file), one per objective, named by its kind."""
from jbert.tasks.sentence_embedding import features
from jbert.tasks.sources import Dataset

DATASETS: dict[str, Dataset] = {t.name: t for t in (
    Dataset(name=kind, kind=kind, tfds_name=None, splits={}, eval_splits=("validation",),
            text_keys=("text_a", "text_b", "text_c"), label_key="label", num_labels=1, label_names=None,
            metrics=metrics, features=features.sentence_features)
    for kind, metrics in (("sts_cosine", ("spearman", "pearson")), ("nli_softmax", ("accuracy",)),
                          ("mnrl", ("mrr@10", "ndcg@10", "recall@1", "recall@10")), ("triplet", ("accuracy",))))}
