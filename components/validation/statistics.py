"""StatisticsGen: TFX's, with the Beam settings for large examples, and its options for images.

StatisticsGen(examples=..., stats_options=stats_options()) running StatisticsGenExecutor (beam_settings.with_executor)
"""

import tensorflow_data_validation as tfdv
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx.components.statistics_gen import executor as statistics_gen_executor

from components.beam_settings import BeamConfigured
from trainer.features import IMAGE_KEY


class StatisticsGenExecutor(BeamConfigured, statistics_gen_executor.Executor):
    pass


def stats_options() -> tfdv.StatsOptions:
    """Statistics of every feature, with image/encoded known as an image before any schema exists.

    Semantic domain stats recognise image/encoded as images (format histogram; SchemaGen then
    writes image_domain). Without a schema, though, TFDV takes every string feature for a
    categorical one and counts its top values by shuffling each distinct value through a
    GroupByKey: every image's bytes, the whole corpus through memory (docs/data.md: Full-size photos).
    Naming image/encoded an image_domain feature makes it a bytes feature (byte-length stats, no
    top-k), whatever schema the run then uses.
    """
    schema = schema_pb2.Schema()
    feature = schema.feature.add(name=IMAGE_KEY, type=schema_pb2.BYTES)
    feature.image_domain.SetInParent()
    return tfdv.StatsOptions(enable_semantic_domain_stats=True, schema=schema)
