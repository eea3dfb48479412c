"""bertkit on Spark (`bertkit.spark`): the embedding UDF on a local[2] session equals the library's
vectors, each executor process loads the model once, and a column that is not strings is one
error naming it. Skips, saying so, where pyspark or Java is absent (Debian: apt-get install
openjdk-17-jre-headless; .ci/run installs it)."""

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'bertkit[spark]')")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Java is not installed (Debian: apt-get install openjdk-17-jre-headless; .ci/run installs it), "
                "so Spark cannot start", allow_module_level=True)

import pandas as pd  # noqa: E402  (after the skips: pyspark's pandas UDFs need it)

from bertkit.inference import embed  # noqa: E402
from bertkit.spark import embed_column  # noqa: E402

TEXTS = [f"{t} ({i})" for i in range(40) for t in ["A man is playing a guitar.", "Stocks fell."]][:60]


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    from pyspark.sql import SparkSession

    # the Python workers run this interpreter (Spark's default is `python3` on the PATH)
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable

    session = (SparkSession.builder.master("local[2]").appName("bertkit-test")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark")))
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    yield session
    session.stop()
    if before is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = before


def test_the_udf_equals_the_library_and_loads_the_model_once_per_process(spark, minilm_dir):
    from pyspark.sql.functions import pandas_udf

    df = spark.createDataFrame([(i, t) for i, t in enumerate(TEXTS)], "id long, text string").repartition(6, "id")
    rows = embed_column(df, minilm_dir, threads=1).orderBy("id").collect()
    got = np.array([r["embedding"] for r in rows], dtype=np.float32)
    want = embed(minilm_dir, [r["text"] for r in rows]).numpy()
    assert got.shape == (len(TEXTS), 384) and np.abs(got - want).max() <= 1e-6

    @pandas_udf("string")
    def engines(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        """What the embedding UDF left in each Python worker (Spark reuses them across tasks)."""
        from bertkit.spark import _SHARED

        for texts in batches:
            loaded = sorted(str(id(e._engine)) for e in _SHARED.values() if e._engine is not None)
            yield pd.Series([f"{os.getpid()}:{len(_SHARED)}:{','.join(loaded)}"] * len(texts))

    seen = {r["e"] for r in df.select(engines("text").alias("e")).collect()}
    counts = [int(s.split(":")[1]) for s in seen]
    assert max(counts) == 1 and min(counts) <= 1, f"a process holds more than one engine: {seen}"


def test_a_column_that_is_not_strings_is_one_error_naming_it(spark, minilm_dir):
    df = spark.createDataFrame([(1, 2.5)], "id long, score double")
    with pytest.raises(ValueError, match="column 'score' is double, not strings; cast it"):
        embed_column(df, minilm_dir, column="score")
    with pytest.raises(ValueError, match="the DataFrame has no column 'text' .columns: id, score."):
        embed_column(df, minilm_dir)


def test_the_documented_example_runs(spark, minilm_dir, capsys):
    page = (Path(__file__).resolve().parents[1] / "docs" / "scaling.md").read_text()
    example = page.split("## Spark", 1)[1]
    code = re.findall(r"^```python\n(.*?)^```", example, flags=re.S | re.M)[0]
    exec(code, {"spark": spark, "MODEL_DIR": str(minilm_dir)})
    assert capsys.readouterr().out.strip().endswith("array<float> 384")
