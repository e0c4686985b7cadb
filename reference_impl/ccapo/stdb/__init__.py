"""The STDB (spatio-temporal database of edge statistics): the pure update rule and its stores."""
from reference_impl.ccapo.stdb.base import STDBStore
from reference_impl.ccapo.stdb.memory import MemorySTDB
from reference_impl.ccapo.stdb.sql import POSTGRES, SCHEMA_SQL, SQLITE, SQLSTDB, Dialect, postgres_store, sqlite_store
from reference_impl.ccapo.stdb.update import (batch_fold, batch_keys, empty_stats, fold_rows, plan_batch, stdb_fold,
                                              stdb_update, trajectory_edges)

__all__ = ["STDBStore", "MemorySTDB", "SQLSTDB", "Dialect", "SQLITE", "POSTGRES", "SCHEMA_SQL",
           "sqlite_store", "postgres_store", "empty_stats", "stdb_update", "stdb_fold", "fold_rows", "batch_fold",
           "plan_batch", "batch_keys", "trajectory_edges"]
