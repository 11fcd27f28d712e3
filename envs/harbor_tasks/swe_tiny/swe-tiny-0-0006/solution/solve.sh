#!/bin/bash
sed -i 's|return .*|return price * (100 - 21) / 100|' /app/*.py
