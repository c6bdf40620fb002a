#!/usr/bin/env bash
# System packages the project needs: Java 17 for Spark, the Debian JDBC drivers for the
# Iceberg JDBC catalog (SQLite by default, PostgreSQL for production-like setups), and, for
# the test suite, a PostgreSQL server and Chromium.
# Idempotent: installs only what is missing.
set -euo pipefail
need=()
# PostgreSQL server (any version): the production-like catalog, started by the test suite's fixture
compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || command -v pg_ctl >/dev/null 2>&1 || need+=(postgresql)
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
# headless Chromium for the browser test of the Dagster UI (driven by Playwright)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -f /usr/share/java/sqlite-jdbc.jar ] || need+=(libxerial-sqlite-jdbc-java)
[ -f /usr/share/java/postgresql.jar ] || need+=(libpostgresql-jdbc-java)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
echo "installing system packages: ${need[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
