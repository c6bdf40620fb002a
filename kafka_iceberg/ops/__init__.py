"""Operations over committed tables: lag, retention headroom, checks, maintenance and alerts."""
