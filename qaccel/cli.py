"""The ``qaccel`` command line.

    qaccel demo                 the main job on the default configuration (see README.md)
    qaccel bench golden         golden model vs ONNX Runtime, side by side
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _bench(args) -> int:
    from qaccel import bench

    print(f"building the {'quick ' if args.quick else ''}golden benchmark cases...", flush=True)
    cases = bench.golden_cases(quick=args.quick, seed=args.seed)
    try:
        from tqdm import tqdm
        bar = tqdm(total=len(cases), desc="bench", unit="case", file=sys.stderr)
    except ImportError:  # pragma: no cover - tqdm is a dependency
        bar = None
    rows = bench.run_cases(cases, repeat=args.repeat,
                           progress=(lambda _row: bar.update()) if bar else None)
    if bar:
        bar.close()
    print(bench.format_table(rows))
    _threads_note()
    return 0


def _threads_note():
    import numba
    import onnxruntime

    print(f"(median of alternating runs; numba {numba.__version__} with "
          f"{numba.config.NUMBA_NUM_THREADS} threads, onnxruntime {onnxruntime.__version__} "
          "at its default intra-op threads)")


def _demo(args) -> int:
    from qaccel import demo

    return demo.main(quick=args.quick)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="qaccel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="golden model vs ONNX Runtime on a realistic layer, "
                                    "and the RTL smoke design on Verilator")
    p.add_argument("--quick", action="store_true", help="a smaller layer, for a smoke run")
    p.set_defaults(func=_demo)

    p = sub.add_parser("bench", help="time qaccel against ONNX Runtime")
    p.add_argument("suite", choices=["golden"], help="what to time")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--repeat", type=int, default=7, help="timed runs per case (default 7)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_bench)

    args = parser.parse_args(argv)
    return args.func(args)
