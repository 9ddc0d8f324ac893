"""Shared by the job scripts: a SparkSession, and the discovery flags.

The scripts are plain files for `spark-submit` (not a package); each adds this folder to
sys.path implicitly because spark-submit runs the script from it.
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession


def session(app: str) -> SparkSession:
    """format("streamwal") needs no registration: PySpark finds pyspark_streamwal."""
    return SparkSession.builder.appName(app).getOrCreate()


def discovery_args(parser: argparse.ArgumentParser) -> None:
    way = parser.add_mutually_exclusive_group(required=True)
    way.add_argument("--coord", help="HOST:PORT of the coord's AssignmentDiscover")
    way.add_argument("--kubernetes", metavar="NAMESPACE", help="read PChannel status here")
    way.add_argument("--nodes", help="HOST:PORT,... of streaming nodes (no coord)")
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster or ~/.kube)")


def discovery_options(args: argparse.Namespace) -> dict[str, str]:
    names = ("coord", "kubernetes", "nodes", "kubeconfig")
    return {n: getattr(args, n) for n in names if getattr(args, n)}
