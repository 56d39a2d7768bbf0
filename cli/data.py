"""`imagepipe sample-data | cache`: the digits sample, and the backbone features cache under --root."""

import argparse
import datetime
import math
import os

from cli.common import config_from_args
from components.features import feature_cache
from pipeline.config import ConfigError, PipelineConfig
from pipeline.environment import from_environment


def cmd_sample_data(args: argparse.Namespace) -> int:
    from pipeline.sample_data import make_digits  # PIL: not at the CLI's start-up, which imports this module

    out = os.path.abspath(args.out or from_environment(PipelineConfig()).sample_data_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--out {out}: not a folder; give a folder to write the images into")
    try:
        info = make_digits(out)
    except OSError as e:
        raise ConfigError(
            f"--out {out}: cannot write the images there ({e.strerror or e}); give a folder you "
            "can write to, on a disk with room"
        ) from None
    print(f"{info['files']:,} images in {info['classes']} classes at {info['path']}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.max_gb is not None and not (math.isfinite(args.max_gb) and args.max_gb >= 0):
        raise ConfigError(f"--max-gb {args.max_gb}: give a size in GB (a number, 0 or more)")
    limit = 0 if args.clear else None if args.max_gb is None else int(args.max_gb * 2**30)
    if limit is not None:
        removed = feature_cache.prune(config.feature_cache, limit)
        freed = sum(d["bytes"] for d in removed)
        print(f"removed {len(removed)} backbone cache{'s' if len(removed) != 1 else ''}, {freed / 2**30:.2f} GB")
    found = feature_cache.describe(config.feature_cache)
    if not found:
        print(f"no cached features in {config.feature_cache}")
        return 0
    print(f"{'backbone':<16} {'size':>5} {'features':>10} {'GB':>7}  {'last used (UTC)':<20} fingerprint")
    for d in sorted(found, key=lambda d: d["last_used"], reverse=True):
        used = datetime.datetime.fromtimestamp(d["last_used"], datetime.timezone.utc)
        print(
            f"{d['model'] or '?':<16} {d['image_size'] or '?':>5} {d['entries']:>10,} {d['bytes'] / 2**30:>7.2f}  "
            f"{used:%Y-%m-%d %H:%M:%S}  {d['fingerprint']}"
        )
    print(f"in {config.feature_cache}")
    return 0
