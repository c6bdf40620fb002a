#!/bin/sh
# The user-code image's steps, in one place: deploy/Dockerfile runs this script, and
# tests/test_image.py runs it into a temporary directory that stands in for the image, then starts
# the chart's code-server command from that tree as the image's user. The two cannot drift.
#
#   deploy/build-image.sh ROOT
#
# ROOT is the image's root directory ("/" in the Dockerfile). The script
#   1. installs the locked runtime tree (requirements-runtime.lock, --require-hashes) into $PYTHON's
#      environment, unless LAKE_IMAGE_LOCK is set to an empty value (a test that reuses installed
#      dependencies);
#   2. copies the project's sources (the SOURCES list below) to a build directory OUTSIDE the
#      working directory, builds the wheel there and installs it with --no-deps: the package-dir
#      mapping of pyproject.toml assembles kafka_iceberg.lake_assets, .resources, .sensors and
#      .schedules only in the installed package, and `dagster api grpc` puts its working directory
#      first on sys.path, so a source tree in the WORKDIR would shadow the installed package;
#   3. optionally (WITH_S3=1) adds Iceberg's AWS bundle to pyspark's jars/, checksum checked;
#   4. makes the WORKDIR (/opt/lake, holding no source), DAGSTER_HOME and LAKE_HOME, owned by the
#      image's user (uid 10001) when run as root.
#
# Environment: PYTHON (default python), LAKE_IMAGE_LOCK (default requirements-runtime.lock, relative
# to the sources), LAKE_IMAGE_BUILD_ISOLATION (1, the default: pip fetches the build backend;
# 0: use the one installed beside $PYTHON), WITH_S3, ICEBERG_VERSION, ICEBERG_AWS_BUNDLE_URL.
set -eu

ROOT="${1:?usage: build-image.sh ROOT}"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python}"
LOCK="${LAKE_IMAGE_LOCK-requirements-runtime.lock}"
ICEBERG_VERSION="${ICEBERG_VERSION:-1.10.2}"
ICEBERG_AWS_BUNDLE_URL="${ICEBERG_AWS_BUNDLE_URL:-https://repo1.maven.org/maven2/org/apache/iceberg/iceberg-aws-bundle/${ICEBERG_VERSION}/iceberg-aws-bundle-${ICEBERG_VERSION}.jar}"
IMAGE_UID=10001
WORKDIR=/opt/lake
DAGSTER_HOME_DIR=/opt/dagster/dagster_home
LAKE_HOME_DIR=/opt/dagster/lake
# what the wheel is built from (deploy/Dockerfile copies the same list; tests/test_image.py checks it)
SOURCES="pyproject.toml README.md kafka_iceberg lake_assets resources sensors schedules"

# 1. the locked runtime tree
if [ -n "$LOCK" ]; then
  "$PYTHON" -m pip install --require-hashes -r "$SRC/$LOCK"
fi

# 2. the project, built outside the WORKDIR and installed without dependencies
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
mkdir -p "$build/src"
for item in $SOURCES; do
  cp -R "$SRC/$item" "$build/src/$item"
done
find "$build/src" -name __pycache__ -type d -prune -exec rm -rf {} +
isolation=""
[ "${LAKE_IMAGE_BUILD_ISOLATION:-1}" = "1" ] || isolation="--no-build-isolation"
"$PYTHON" -m pip wheel --no-deps $isolation -q -w "$build/dist" "$build/src"
"$PYTHON" -m pip install --no-deps --force-reinstall "$build"/dist/*.whl
"$PYTHON" -m pip check
"$PYTHON" -c "import snowpark_connect_deps_iceberg as d; print(d.get_jar_path('iceberg-spark-runtime-3.5_2.12-1.10.2.jar'))"

# 3. Iceberg's AWS bundle (S3FileIO and the AWS SDK) for warehouses and catalogs on S3
if [ "${WITH_S3:-0}" = "1" ]; then
  jars="$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
  jar="$jars/iceberg-aws-bundle-${ICEBERG_VERSION}.jar"
  curl -fsSL -o "$jar" "$ICEBERG_AWS_BUNDLE_URL"
  echo "$(curl -fsSL "$ICEBERG_AWS_BUNDLE_URL.sha1")  $jar" | sha1sum -c -
fi

# 4. the image's directories: an empty WORKDIR, DAGSTER_HOME and LAKE_HOME (Spark scratch) of uid 10001
mkdir -p "$ROOT$WORKDIR" "$ROOT$DAGSTER_HOME_DIR" "$ROOT$LAKE_HOME_DIR"
if [ "$(id -u)" = "0" ]; then
  if [ "$ROOT" = "/" ] && ! id "$IMAGE_UID" >/dev/null 2>&1; then
    useradd --uid "$IMAGE_UID" --create-home --shell /usr/sbin/nologin lake
  fi
  chown -R "$IMAGE_UID:$IMAGE_UID" "$ROOT/opt/dagster"
fi
