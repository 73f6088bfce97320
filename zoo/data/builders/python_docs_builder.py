"""TFDS builder for the pydoc topic help text (``zoo.data.python_docs``)."""

import platform

import tensorflow_datasets as tfds

from zoo.data.python_docs import SPLIT_FRACTIONS, TOPIC_GROUPS, python_docs_topics

UNGROUPED = ""  # group of a topic no TOPIC_GROUPS class lists (language modelling only)


class PythonDocsBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """``zoo_python_docs``: one example per (pydoc topic, split) of this Python's help text."""

    name = "zoo_python_docs"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: topics split by position 90% / 5% / 5%."}

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "The language reference sections that help('if') shows, from "
                "pydoc_data.topics of the Python that prepared the data (prepared here "
                f"with Python {platform.python_version()}; the text differs slightly "
                "between versions). One example per topic and split: each topic's text "
                "is cut by position, the first 90% train, the next 5% validation, the "
                "last 5% test. `group` is the topic's class in zoo.data.python_docs."
                "TOPIC_GROUPS, or '' for topics used for language modelling only."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "topic": tfds.features.Text(),
                    "group": tfds.features.Text(),
                    "text": tfds.features.Text(),
                }
            ),
            disable_shuffling=True,  # keep topics sorted
            homepage="https://docs.python.org/3/reference/",
            license="Python Software Foundation License (Python documentation)",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # the text ships with every CPython
        return {split: self._generate_examples(split) for split in SPLIT_FRACTIONS}

    def _generate_examples(self, split):
        groups = {topic: group for group, topics in TOPIC_GROUPS.items() for topic in topics}
        start, stop = SPLIT_FRACTIONS[split]
        for topic, text in python_docs_topics().items():
            part = text[int(start * len(text)) : int(stop * len(text))]
            yield topic, {"topic": topic, "group": groups.get(topic, UNGROUPED), "text": part}
