"""Generated SBE codecs; see ``tensorpool.specs.codegen``. Do not edit."""
