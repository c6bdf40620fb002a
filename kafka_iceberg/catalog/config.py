"""One Iceberg catalog configuration, in pyiceberg's standard properties, for both clients.

The catalog is described once, as pyiceberg catalog properties (``type``, ``uri``,
``warehouse``, ``io-impl``, ``s3.*``, ``credential``, ...), and translated into

* the keyword arguments of ``pyiceberg.catalog.load_catalog(name, **props)``, and
* Spark's ``spark.sql.catalog.<name>.*`` settings for Iceberg's ``SparkCatalog``.

Supported types: ``sql`` (alias ``jdbc``: SQLite or PostgreSQL), ``rest``, ``glue``, ``hive``
and ``nessie`` (through Nessie's Iceberg REST endpoint, for both clients).

Where the properties come from (:func:`catalog_config_from_env`):

* ``LAKE_CATALOG_PROPERTIES``: a JSON object of the non-secret properties (a ConfigMap);
* ``PYICEBERG_CATALOG__<NAME>__<KEY>``: pyiceberg's own environment spelling
  (``S3__ACCESS_KEY_ID`` is ``s3.access-key-id``), for secrets and non-secrets alike;
* ``LAKE_CATALOG_SECRETS_DIR``: a directory with one file per secret property, named after it
  (a Kubernetes Secret mounted as a volume), e.g. ``credential``, ``s3.secret-access-key``.

Credentials never come from ``LAKE_CATALOG_PROPERTIES`` or a tables/YAML file: a secret key
there is a :class:`~kafka_iceberg.errors.ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from kafka_iceberg.errors import ConfigError

CATALOG_TYPES = ("sql", "jdbc", "rest", "glue", "hive", "nessie")

SECRET_KEYS = frozenset(
    {
        "credential",
        "token",
        "password",
        "jdbc.password",
        "s3.access-key-id",
        "s3.secret-access-key",
        "s3.session-token",
        "glue.access-key-id",
        "glue.secret-access-key",
        "glue.session-token",
        "client.access-key-id",
        "client.secret-access-key",
        "client.session-token",
        "gcs.oauth2.token",
        "adls.account-key",
        "adls.sas-token",
    }
)
"""Properties that carry credentials: only from the environment or a secret file."""

S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
S3_ONLY_CLIENT_FACTORY = "org.apache.iceberg.aws.s3.DefaultS3FileIOAwsClientFactory"
"""Iceberg's S3-only client factory: builds S3 clients from ``s3.*``/``client.*`` properties without
loading Iceberg's general ``AwsProperties``, which needs the KMS, Glue and DynamoDB SDK modules."""

# pyiceberg property -> Iceberg Java (Spark) property, where the two spellings differ
_PY_TO_JAVA = {"s3.region": "client.region", "glue.region": "client.region"}
# properties only one client understands
_PY_ONLY = {"py-io-impl", "s3.force-virtual-addressing", "downcast-ns-timestamp-to-us-on-write", "nessie.ref"}
_JAVA_ONLY_PREFIXES = ("jdbc.", "spark.")


@dataclass(frozen=True)
class CatalogSettings:
    """Where the Iceberg JDBC catalog lives, in the two spellings its two clients need.

    ``name`` is the Iceberg catalog name. It is stored in the ``catalog_name`` column
    of the JDBC catalog tables, so Spark (``spark.sql.catalog.<name>``) and pyiceberg
    (``SqlCatalog(<name>)``) must use the same one to see the same tables.
    """

    name: str
    sqlalchemy_uri: str  # for pyiceberg's SqlCatalog, e.g. sqlite:////abs/catalog.db
    jdbc_uri: str  # for Iceberg's JdbcCatalog in Spark, e.g. jdbc:sqlite:/abs/catalog.db
    jdbc_user: str | None
    jdbc_password: str | None
    warehouse: str  # file:///abs/warehouse or s3://bucket/prefix
    config: CatalogConfig | None = None  # the same catalog as pyiceberg properties (kafka_iceberg.catalog.config)

    def __repr__(self) -> str:
        """Without the password (in ``jdbc_password`` and inside ``sqlalchemy_uri``): settings are logged."""
        return (
            f"CatalogSettings(name={self.name!r}, jdbc_uri={self.jdbc_uri!r}, jdbc_user={self.jdbc_user!r}, "
            f"warehouse={self.warehouse!r}, config={self.config!r})"
        )

    @property
    def is_sqlite(self) -> bool:
        """True for the embedded SQLite catalog, which admits one committing process at a time."""
        return self.jdbc_uri.startswith("jdbc:sqlite:")

    @property
    def jdbc_driver_jar(self) -> str:
        """Path of the Debian JDBC driver jar Spark needs for this catalog."""
        return "/usr/share/java/sqlite-jdbc.jar" if self.is_sqlite else "/usr/share/java/postgresql.jar"


@dataclass(frozen=True)
class CatalogConfig:
    """An Iceberg catalog: its ``name`` (the same for Spark and pyiceberg) and pyiceberg ``properties``.

    ``properties`` map property names to string values; ``type`` is one of
    :data:`CATALOG_TYPES`. Build with :func:`catalog_config_from_env` or directly.
    """

    name: str
    properties: dict[str, str] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        shown = {k: ("***" if k in SECRET_KEYS else v) for k, v in self.properties.items()}
        return f"CatalogConfig(name={self.name!r}, properties={shown!r})"

    def __post_init__(self):
        kind = self.properties.get("type", "")
        if kind not in CATALOG_TYPES:
            raise ConfigError(f"catalog {self.name}: type must be one of {', '.join(CATALOG_TYPES)}, got {kind!r}")
        if kind in ("sql", "jdbc", "rest", "hive", "nessie") and not self.properties.get("uri"):
            raise ConfigError(f"catalog {self.name}: a {kind} catalog needs a uri")

    @property
    def type(self) -> str:
        """The catalog type with ``jdbc`` folded into ``sql``."""
        kind = self.properties["type"]
        return "sql" if kind == "jdbc" else kind

    @property
    def warehouse(self) -> str | None:
        """The warehouse location (``file:///...``, ``s3://bucket/prefix``), if configured."""
        return self.properties.get("warehouse")

    def pyiceberg_properties(self) -> dict[str, str]:
        """Keyword arguments for ``pyiceberg.catalog.load_catalog(self.name, **props)``.

        Raises:
            ConfigError: a ``sql``/``jdbc`` uri that is neither SQLite nor PostgreSQL.
        """
        props = {k: v for k, v in self.properties.items() if not k.startswith(_JAVA_ONLY_PREFIXES)}
        props.pop("io-impl", None)  # a Java class; pyiceberg picks its FileIO from the scheme or py-io-impl
        props.pop("nessie.ref", None)
        if self.type == "sql":
            props.update(type="sql", uri=_sql_uris(self)[0])
            props.pop("password", None)  # folded into the SQLAlchemy uri
        elif self.type == "nessie":
            props.update(type="rest", uri=_nessie_rest_uri(self))
        return props

    def spark_properties(self) -> dict[str, str]:
        """``spark.sql.catalog.<name>`` and ``spark.sql.catalog.<name>.*`` settings for Iceberg's SparkCatalog.

        Catalog settings are runtime SQL settings: a running session can add this catalog with
        ``spark.conf.set``. S3 warehouses need Iceberg's AWS bundle jar on Spark's classpath.

        Raises:
            ConfigError: a ``sql``/``jdbc`` uri that is neither SQLite nor PostgreSQL.
        """
        java = {}
        for key, value in self.properties.items():
            if key in _PY_ONLY or key == "type":
                continue
            java[_PY_TO_JAVA.get(key, key)] = value
        if self.type == "sql":
            jdbc_uri, user, password = _sql_uris(self)[1:]
            java.update(
                {"type": "jdbc", "uri": jdbc_uri, "jdbc.schema-version": "V1", "jdbc.init-catalog-tables": "false"}
            )
            java.pop("password", None)
            if user:
                java.setdefault("jdbc.user", user)
            if password:
                java.setdefault("jdbc.password", password)
        elif self.type == "nessie":
            java.update(type="rest", uri=_nessie_rest_uri(self))
        else:
            java["type"] = self.type
        if (self.warehouse or "").startswith(("s3://", "s3a://")) and "io-impl" not in java:
            java["io-impl"] = S3_FILE_IO
        if java.get("io-impl") == S3_FILE_IO and self.type != "glue" and "client.factory" not in java:
            java.setdefault("s3.client-factory-impl", S3_ONLY_CLIENT_FACTORY)
        java.setdefault("cache-enabled", "false")  # every micro-batch step must see the latest metadata
        prefix = f"spark.sql.catalog.{self.name}"
        return {prefix: "org.apache.iceberg.spark.SparkCatalog", **{f"{prefix}.{k}": v for k, v in java.items()}}

    def to_catalog_settings(self):
        """The :class:`kafka_iceberg.config.settings.CatalogSettings` of this catalog (JDBC spellings for a
        sql catalog, empty ones otherwise), carrying this config in its ``config`` field."""

        if self.type == "sql":
            sa_uri, jdbc_uri, user, password = _sql_uris(self)
        else:
            sa_uri, jdbc_uri, user, password = "", "", None, None
        return CatalogSettings(self.name, sa_uri, jdbc_uri, user, password, self.warehouse or "", config=self)

    def load(self):
        """The pyiceberg catalog (``pyiceberg.catalog.load_catalog``); opens a connection for sql/rest/hive/glue.

        Raises:
            Whatever pyiceberg raises for an unreachable catalog (connection, HTTP or SQL errors).
        """
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.name, **self.pyiceberg_properties())


def _sql_uris(cfg: CatalogConfig) -> tuple[str, str, str | None, str | None]:
    """(SQLAlchemy uri, JDBC uri, user, password) of a sql/jdbc catalog; the password may come
    from the ``password`` property instead of the uri."""
    uri = cfg.properties["uri"]
    password = cfg.properties.get("password")
    if uri.startswith("jdbc:sqlite:"):
        path = uri[len("jdbc:sqlite:") :]
        return f"sqlite:///{path}", uri, None, None
    if uri.startswith("jdbc:postgresql://"):
        parsed = urlparse(uri[len("jdbc:") :])
        user = cfg.properties.get("jdbc.user")
        password = cfg.properties.get("jdbc.password", password)
        auth = f"{user}:{password}@" if user and password else (f"{user}@" if user else "")
        host = f"{parsed.hostname}:{parsed.port or 5432}"
        return f"postgresql+psycopg2://{auth}{host}{parsed.path}", uri, user, password
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = uri[len("sqlite:///") :]
        if not path.startswith("/"):
            raise ConfigError(
                f"catalog {cfg.name}: use an absolute SQLite path (sqlite:////abs/catalog.db), got {uri!r}"
            )
        return uri, f"jdbc:sqlite:{path}", None, None
    if parsed.scheme in ("postgresql", "postgres", "postgresql+psycopg2"):
        user = unquote(parsed.username) if parsed.username else None
        password = unquote(parsed.password) if parsed.password else password
        host = f"{parsed.hostname or '127.0.0.1'}:{parsed.port or 5432}"
        auth = f"{user}:{password}@" if user and password else (f"{user}@" if user else "")
        return (
            f"postgresql+psycopg2://{auth}{host}{parsed.path}",
            f"jdbc:postgresql://{host}{parsed.path}",
            user,
            password,
        )
    raise ConfigError(
        f"catalog {cfg.name}: sql uri scheme {parsed.scheme!r} is not supported; use sqlite:// or postgresql://"
    )


def _nessie_rest_uri(cfg: CatalogConfig) -> str:
    """Nessie's Iceberg REST endpoint: ``<uri>/iceberg[/<nessie.ref>]`` (``uri`` is the server root,
    e.g. ``http://nessie:19120``; an ``.../api/v2`` suffix is dropped)."""
    base = cfg.properties["uri"].rstrip("/").removesuffix("/api/v2").removesuffix("/api/v1")
    if not base.endswith("/iceberg"):
        base += "/iceberg"
    ref = cfg.properties.get("nessie.ref")
    return f"{base}/{ref}" if ref else base


def _pyiceberg_env(env: dict[str, str], name: str) -> dict[str, str]:
    """Properties from ``PYICEBERG_CATALOG__<NAME>__<KEY>`` (pyiceberg's spelling: ``__`` is ``.``, ``_`` is ``-``)."""
    prefix = f"PYICEBERG_CATALOG__{name.upper()}__"
    return {
        k[len(prefix) :].lower().replace("__", ".").replace("_", "-"): v for k, v in env.items() if k.startswith(prefix)
    }


def _secret_files(directory: str) -> dict[str, str]:
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"LAKE_CATALOG_SECRETS_DIR={directory!r} is not a directory")
    # Kubernetes mounts each key as a file (plus ..data symlinks, which start with a dot)
    return {p.name: p.read_text().strip() for p in sorted(root.iterdir()) if p.is_file() and not p.name.startswith(".")}


def catalog_properties_from_env(env: dict[str, str], name: str = "lake") -> dict[str, str] | None:
    """The catalog properties of ``LAKE_CATALOG_PROPERTIES``, ``PYICEBERG_CATALOG__<NAME>__*`` and
    ``LAKE_CATALOG_SECRETS_DIR`` (later sources win), or ``None`` when none of them is set. They may
    lack ``type`` (credentials only, for the catalog of ``LAKE_CATALOG_URI``).

    ``env``: the process environment (empty values already removed).

    Raises:
        ConfigError: bad JSON, a credential inside ``LAKE_CATALOG_PROPERTIES``, a missing secrets directory.
    """
    import json

    raw = env.get("LAKE_CATALOG_PROPERTIES", "").strip()
    from_env = _pyiceberg_env(env, name)
    secrets_dir = env.get("LAKE_CATALOG_SECRETS_DIR")
    if not (raw or from_env or secrets_dir):
        return None
    try:
        props = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"LAKE_CATALOG_PROPERTIES must be a JSON object: {exc}") from exc
    if not isinstance(props, dict):
        raise ConfigError("LAKE_CATALOG_PROPERTIES must be a JSON object")
    leaked = sorted(set(props) & SECRET_KEYS)
    if leaked:
        raise ConfigError(
            f"LAKE_CATALOG_PROPERTIES holds credentials {leaked}: put them in the environment "
            f"(PYICEBERG_CATALOG__{name.upper()}__...) or LAKE_CATALOG_SECRETS_DIR"
        )
    merged = {str(k): str(v) for k, v in props.items()}
    merged.update(from_env)
    if secrets_dir:
        merged.update(_secret_files(secrets_dir))
    return merged


def catalog_config_from_env(env: dict[str, str], name: str = "lake") -> CatalogConfig | None:
    """The catalog described by :func:`catalog_properties_from_env`, or ``None`` when none of its
    variables is set (then ``LAKE_CATALOG_URI``/``LAKE_WAREHOUSE`` apply, see :func:`resolve_catalog`).

    Raises:
        ConfigError: see :func:`catalog_properties_from_env`; an unknown type or a missing uri.
    """
    props = catalog_properties_from_env(env, name)
    return None if props is None else CatalogConfig(name, props)


def catalog_from_uri(name: str, uri: str, warehouse: str) -> CatalogSettings:
    """Derive the JDBC (Spark) and SQLAlchemy (pyiceberg) spellings from one URI.

    Accepts ``sqlite:////abs/path/catalog.db`` or
    ``postgresql://user:password@host:port/database``.

    Raises:
        ConfigError: for any other scheme, or a relative SQLite path.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = uri[len("sqlite:///") :]
        if not path.startswith("/"):
            raise ConfigError(
                f"LAKE_CATALOG_URI must use an absolute SQLite path (sqlite:////abs/catalog.db), got {uri!r}"
            )
        return CatalogSettings(
            name,
            uri,
            f"jdbc:sqlite:{path}",
            None,
            None,
            warehouse,
            CatalogConfig(name, {"type": "sql", "uri": uri, "warehouse": warehouse}),
        )
    if parsed.scheme in ("postgresql", "postgres", "postgresql+psycopg2"):
        host = parsed.hostname or "127.0.0.1"
        port = parsed.port or 5432
        db = parsed.path.lstrip("/")
        user = unquote(parsed.username) if parsed.username else None
        password = unquote(parsed.password) if parsed.password else None
        sa_uri = "postgresql+psycopg2://" + uri.split("://", 1)[1]
        return CatalogSettings(
            name,
            sa_uri,
            f"jdbc:postgresql://{host}:{port}/{db}",
            user,
            password,
            warehouse,
            CatalogConfig(name, {"type": "sql", "uri": uri, "warehouse": warehouse}),
        )
    raise ConfigError(f"LAKE_CATALOG_URI scheme {parsed.scheme!r} is not supported; use sqlite:// or postgresql://")


def resolve_catalog(env: dict[str, str], name: str, uri: str, warehouse: str) -> CatalogSettings:
    """The catalog named ``name``: from ``LAKE_CATALOG_PROPERTIES``, ``PYICEBERG_CATALOG__<NAME>__*`` and
    ``LAKE_CATALOG_SECRETS_DIR`` in ``env`` when any is set (a sql catalog without a warehouse gets
    ``warehouse``; properties without a type are the credentials of the sql catalog ``uri``), else from
    ``uri`` (:func:`catalog_from_uri`).

    Raises:
        ConfigError: see :func:`catalog_properties_from_env` and :func:`catalog_from_uri`; properties
            without a type and no ``uri``.
    """
    props = catalog_properties_from_env(env, name)  # LAKE_CATALOG_PROPERTIES & co. win over LAKE_CATALOG_URI
    if props is None:
        return catalog_from_uri(name, uri, warehouse)
    if "type" not in props:
        if not uri:
            raise ConfigError(
                "LAKE_CATALOG_PROPERTIES (or LAKE_CATALOG_URI) is not set: name the Iceberg catalog "
                f"(only credentials of catalog {name} are set)"
            )
        props = {"type": "sql", "uri": uri, **props}
    config = CatalogConfig(name, props)
    if config.warehouse is None and config.type == "sql":
        config = CatalogConfig(name, {**config.properties, "warehouse": warehouse})
    return config.to_catalog_settings()
