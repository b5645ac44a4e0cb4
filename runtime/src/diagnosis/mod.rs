//! Diagnosis (placeholder)
